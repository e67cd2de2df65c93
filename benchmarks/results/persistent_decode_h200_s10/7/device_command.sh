# session 10 command 7 (05ac800): the launch-only test, the pass's tests, the 2**31 test
