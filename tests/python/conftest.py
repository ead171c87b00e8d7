"""Runs every test file of this folder under hvdrun: each rank runs the
same tests in the same order, so their collectives match. hvd is
initialized once per process and shut down at the end."""

import pytest

import hvd


@pytest.fixture(scope="session", autouse=True)
def hvd_session():
    hvd.init()
    yield
    hvd.shutdown()
