"""pytest configuration: tests marked `slow` (the real 135M default model) run only with `--slow`."""
import pytest


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
