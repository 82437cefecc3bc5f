import os

import pytest

from goosedump import synth

# The CLI keeps a prompt cache in the user's cache folder by default: the tests
# that are about it name their own folder, the others run without one (set,
# not defaulted: a cache the environment named would carry state across tests).
os.environ["GOOSEDUMP_PROMPT_CACHE"] = "off"

# The CLI reads what is piped to stdin beside a prompt's words (as ollama does):
# the commands the tests start inherit an empty stdin, not whatever the runner's
# is (a pipe it holds open would cost each a wait); tests that pipe text give it.
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory) -> str:
    """A tiny synthetic model with the real vocabulary (written once per session)."""
    path = tmp_path_factory.mktemp("models") / "tiny.gguf"
    synth.write_model(path, "tiny", seed=1)
    return os.fspath(path)


@pytest.fixture(scope="session")
def tiny_model(tiny_path):
    import goosedump
    return goosedump.load(tiny_path)


@pytest.fixture(scope="session")
def small_vocab():
    """A cut-down vocabulary in the real format, for fast file-handling tests."""
    return synth.small_vocab()


@pytest.fixture(scope="session")
def small_model_path(tmp_path_factory, small_vocab) -> str:
    """The tiny preset with the cut-down vocabulary."""
    path = tmp_path_factory.mktemp("models") / "tiny-small-vocab.gguf"
    synth.write_model(path, "tiny", seed=2, vocab=small_vocab)
    return os.fspath(path)
