import json, sys
d = json.load(open(sys.argv[1]))
for row in d["rows"]:
    for v in row["variants"]:
        s = v.get("stage_us_one_pass", {})
        print(row["context"], json.dumps(v["variant"]), round(v["us"], 1), {k: round(x, 2) for k, x in s.items()}, v.get("same_argmax"))
