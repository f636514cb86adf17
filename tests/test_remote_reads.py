"""Why data/remote.py reads HTTP byte ranges itself rather than through ``olmo_core.io``.

The same scripted faults (tests/_http_server.py) go to OLMo-core 3.0.0's ``get_bytes_range`` and to
``RangeReader``. The reference for each is what the data order needs: every requested byte, or a
one-line error after a bounded number of attempts. OLMo-core's reader retries a dropped connection
(as RangeReader does) but gives up at once on a 5xx other than 502 and on a short 206 body, and
sets no timeout on its requests (requests' documented default: wait forever), so a server that
stops answering holds a read for good.
"""

import threading

import pytest
from olmo_core.io import get_bytes_range
from requests import HTTPError

from olmo_patches.data.remote import RangeReader, RetryPolicy

from ._http_server import FileServer

DATA = bytes(range(256)) * 8
NAME = "f.npy"
START, LENGTH = 100, 1000
RETRY = RetryPolicy(attempts=3, backoff_s=0.01, timeout_s=1.0)


@pytest.fixture
def server():
    with FileServer({NAME: DATA}) as srv:
        yield srv


def test_a_dropped_connection_is_retried_by_both(server):
    server.drop[NAME] = 1
    assert get_bytes_range(server.url(NAME), START, LENGTH) == DATA[START : START + LENGTH]
    server.drop[NAME] = 1
    assert RangeReader(RETRY).read(server.url(NAME), START, LENGTH) == DATA[START : START + LENGTH]


@pytest.mark.parametrize("fault, error", [("fail", HTTPError), ("short", AssertionError)])
def test_one_500_or_one_short_body_ends_olmo_cores_read_not_range_readers(server, fault, error):
    getattr(server, fault)[NAME] = 1
    with pytest.raises(error):
        get_bytes_range(server.url(NAME), START, LENGTH)
    assert server.count() == 1  # one attempt, no retry
    getattr(server, fault)[NAME] = 1
    assert RangeReader(RETRY).read(server.url(NAME), START, LENGTH) == DATA[START : START + LENGTH]
    assert server.count() == 3  # RangeReader: the faulty reply, then a good one


def test_a_server_that_stops_answering_holds_olmo_cores_read(server):
    """RangeReader gives up on the silent reply after its timeout and reads the bytes again;
    OLMo-core's read of the same silent reply is still waiting after that (it ends here only once
    the server lets it go)."""
    server.stall[NAME] = 1
    result = {}
    held = threading.Thread(
        target=lambda: result.update(data=get_bytes_range(server.url(NAME), START, LENGTH))
    )
    held.start()
    while server.count() < 1:
        held.join(0.01)
    server.stall[NAME] = 1
    assert RangeReader(RETRY).read(server.url(NAME), START, LENGTH) == DATA[START : START + LENGTH]
    assert server.count() == 3  # OLMo-core's one request; RangeReader's timed-out one and its retry
    assert held.is_alive() and not result  # OLMo-core's read: still waiting on its silent reply
    server.release.set()
    held.join(30)
    assert result["data"] == DATA[START : START + LENGTH]
