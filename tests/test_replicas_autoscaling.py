"""goosedump serve --replicas auto: Ray Serve adds a replica under load.
(Its own file so that test_replicas.py's two-replica server has stopped
before this one starts: with that cluster still up beside it on two cores,
this test took 72 s rather than 45.)"""
import threading
import time

import openai

from test_replicas import HEADER, USER, Served


def test_autoscaling_adds_a_replica_under_load(tiny_path, tmp_path):
    s = Served(tiny_path, tmp_path / "serve.log", "--replicas", "auto", "--min-replicas", "1", "--max-replicas", "2",
               "--max-batch", "1")
    try:
        s.wait_ready(1)
        c = s.client()
        seen: set[str] = set()
        stop = threading.Event()

        def load():
            while not stop.is_set():
                try:
                    r = c.chat.completions.with_raw_response.create(model="tiny", messages=USER, max_tokens=64,
                                                                    temperature=1)
                    seen.add(r.headers[HEADER])
                except openai.APIError:
                    pass
        threads = [threading.Thread(target=load) for _ in range(6)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 180
        while len(seen) < 2 and time.monotonic() < deadline:
            time.sleep(1)
        stop.set()
        for t in threads:
            t.join(120)
        assert len(seen) == 2, f"no second replica under load:\n{s.log.read_text()[-3000:]}"
    finally:
        s.stop()
    s.check_stopped()
