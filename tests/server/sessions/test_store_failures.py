"""What a failed Redis call is told as: refused before anything ran ("nothing was changed") or an outcome not known.

The replies are parsed by redis-py's own parser, as they arrive from Redis 6.2 (a script's error wraps the code:
"... -OOM command not allowed ...") and from Redis 7 (the code leads the reply, and redis-py cuts it off into an
exception class of its own).
"""

import pytest
from redis._parsers.base import BaseParser
from redis.exceptions import ConnectionError, TimeoutError
from txl_server.errors import OutcomeUnknown
from txl_server.sessions.store.failures import failure, never_sent

REFUSED = {
    "redis 7 script out of memory": "OOM command not allowed when used memory > 'maxmemory'. script: "
    "36909d98d9fc17c20cd5784d8efba857e3280db1, on @user_script:6.",
    "redis 6.2 script out of memory": "ERR Error running script (call to f_36909d98): @user_script:6: "
    "@user_script: 6: -OOM command not allowed when used memory > 'maxmemory'.",
    "read-only replica": "READONLY You can't write against a read only replica.",
    "loading": "LOADING Redis is loading the dataset in memory",
    "master down": "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
    "no script": "NOSCRIPT No matching script. Please use EVAL.",
    "too few replicas": "NOREPLICAS Not enough good replicas to write.",
}


@pytest.mark.parametrize("reply", REFUSED.values(), ids=REFUSED.keys())
def test_a_reply_that_refuses_before_running_says_nothing_was_changed(reply):
    exc = BaseParser.parse_error(reply)
    assert never_sent(exc)
    answer = failure(exc, store="session store (Redis)", writes=True, timeout=5.0)
    assert not isinstance(answer, OutcomeUnknown)
    assert "nothing was changed" in str(answer)


def test_out_of_memory_is_named_whatever_the_redis_version():
    for reply in (REFUSED["redis 7 script out of memory"], REFUSED["redis 6.2 script out of memory"]):
        answer = failure(
            BaseParser.parse_error(reply), store="session store (Redis)", writes=True, timeout=5.0
        )
        assert "out of memory" in str(answer)


@pytest.mark.parametrize(
    "exc",
    [
        TimeoutError("Timeout reading from socket"),
        ConnectionError("Connection closed by server."),
        BaseParser.parse_error("ERR Error running script (call to f_1): @user_script:9: user_script:9: boom"),
    ],
    ids=["timeout", "connection lost", "script error after a write"],
)
def test_a_change_sent_without_a_clear_refusal_is_an_outcome_not_known(exc):
    assert not never_sent(exc)
    assert isinstance(failure(exc, store="session store (Redis)", writes=True, timeout=5.0), OutcomeUnknown)
