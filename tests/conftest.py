"""pytest configuration: tests marked `slow` (the real 135M default model) run only with `--slow`."""
import pytest
import torch


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", default=False,
                     help="also run tests marked slow (they load the real SmolLM2-135M default model)")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: needs the real offline default model; run with --slow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--slow"):
        return
    skip_slow = pytest.mark.skip(reason="slow: run with --slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """One torch thread for the whole suite: tiny models gain nothing from more, and on a CPU shared with
    other processes (a server subprocess, other jobs) more threads wait for cores and run many times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
