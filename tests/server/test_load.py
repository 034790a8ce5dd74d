"""gptpipe serve under load: 8 clients score on loopback for 30 s while a push and a rollback
switch the served model twice. No request is lost (every one is answered 200, or counts as a
failure), and every answer is one whole version's: each request scores two texts, and both
scores are the same model's. The two models (the tiny model and another of its config with
fresh weights) score the texts differently, so each answer says which model gave it. The 30 s
is the issue's load duration, not a timing assertion: the push and the rollback are each waited
for by event (tests/server/rest_calls.py)."""

import threading
import time

import numpy as np
import pytest

from components import serving
from contracts.artifacts import SERVING_DIR
from server.client import Endpoint, RestModel
from tests.server.conftest import publish
from tests.server.rest_calls import DEADLINE_S, LOOK_EVERY_S, wait_until_served

pytestmark = pytest.mark.slow

CLIENTS = 8
LOAD_S = 30.0
TEXTS = ["ROMEO:\nBut soft, what light through yonder window breaks?\n", "ALL:\nSpeak, speak.\n"]
ANSWERS_PER_PHASE = 2 * CLIENTS  # answers each model gives before the next switch


def in_process_nats(saved_model) -> np.ndarray:
    import tensorflow as tf
    import tensorflow_text  # noqa: F401 -- the SentencePiece ops

    score = tf.saved_model.load(str(saved_model)).signatures["score"]
    return score(text=tf.constant(TEXTS))["nats"].numpy()


class Clients:
    """CLIENTS threads, each scoring TEXTS over its own connection until `stop`; each answer
    labelled with the model that gave both its scores ("A", "B", or "mixed")."""

    def __init__(self, url_base: str, models: dict[str, np.ndarray]) -> None:
        self.base = url_base
        self.models = models
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.sent = 0
        self.failures: list[str] = []
        self.labels: list[list[str]] = [[] for _ in range(CLIENTS)]
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(CLIENTS)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def _run(self, index: int) -> None:
        client = RestModel(Endpoint(self.base, "gpt"), timeout_s=DEADLINE_S)
        while not self.stop.is_set():
            with self.lock:
                self.sent += 1
            try:
                nats = client.predict("score", {"text": TEXTS})["nats"]
                label = self._which(nats)
            except Exception as err:  # any failure is counted, never lost
                with self.lock:
                    self.failures.append(f"{type(err).__name__}: {err}")
                continue
            with self.lock:
                self.labels[index].append(label)
        client.close()

    def _which(self, nats: np.ndarray) -> str:
        for label, expected in self.models.items():
            if np.allclose(nats, expected, rtol=1e-5, atol=0):
                return label
        return "mixed"

    def count(self, label: str) -> int:
        with self.lock:
            return sum(labels.count(label) for labels in self.labels)

    def wait_for(self, label: str, at_least: int) -> None:
        until = time.monotonic() + DEADLINE_S
        while self.count(label) < at_least:
            assert not self.failures, self.failures[:3]
            assert time.monotonic() < until, f"fewer than {at_least} answers by {label}"
            time.sleep(LOOK_EVERY_S)

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(DEADLINE_S)
        assert not any(t.is_alive() for t in self.threads), "a client never finished"


@pytest.mark.heavy
def test_eight_clients_through_a_push_and_a_rollback_lose_nothing_and_see_whole_versions(
    serving_folder, serve_folder, tiny_model, other_model, ledger
):
    models = {"A": in_process_nats(tiny_model / SERVING_DIR), "B": in_process_nats(other_model)}
    assert not np.allclose(models["A"], models["B"], rtol=1e-3)
    with serve_folder(serving_folder) as running:
        clients = Clients(running.url.removesuffix("/v1/models/gpt"), models)
        started = time.monotonic()
        clients.start()
        try:
            clients.wait_for("A", ANSWERS_PER_PHASE)
            publish(other_model, serving_folder)  # the push: version 2, model B
            wait_until_served(running.url, 2)
            clients.wait_for("B", ANSWERS_PER_PHASE)
            a_before = clients.count("A")
            serving.rollback(str(serving_folder), 1)  # version 3: model A again
            wait_until_served(running.url, 3)
            clients.wait_for("A", a_before + ANSWERS_PER_PHASE)
            clients.stop.wait(max(0.0, LOAD_S - (time.monotonic() - started)))  # the load's length
        finally:
            clients.finish()
    answered = sum(len(labels) for labels in clients.labels)
    ledger("serve requests", clients.sent, answered)
    assert clients.failures == [] and answered == clients.sent
    assert clients.count("mixed") == 0, "an answer mixed two versions"
    for labels in clients.labels:  # A, then B, then A again (or a part): never back and forth
        changes = [label for i, label in enumerate(labels) if i == 0 or labels[i - 1] != label]
        assert "".join(changes) in ("ABA", "AB", "BA", "A", "B"), changes
