# session 10 command 8 (05ac800): tests/test_gpu.py whole
