"""Fixtures for the TorchRL integration: real ``ChatEnv`` objects, no model (``_driver``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pytest
from tests._extras import missing, skip_every_module

REASON = missing("torchrl")
if REASON is not None:
    pytest_pycollect_makemodule = skip_every_module(REASON)
else:
    from tests.torchrl._driver import ChatDriver
    from torchrl.envs import Transform


@pytest.fixture
def chat() -> Iterator[Callable[..., ChatDriver]]:
    """``chat(transform, batch_size)`` -> a reset :class:`ChatDriver`.

    Transforms are closed after the test.
    """
    made: list[ChatDriver] = []

    def make(
        transform: Transform | Sequence[Transform], batch_size: int = 2, **kwargs: object
    ) -> ChatDriver:
        driver = ChatDriver(transform, batch_size, **kwargs)  # type: ignore[arg-type]
        driver.reset()
        made.append(driver)
        return driver

    yield make
    for driver in made:
        for t in driver.env.transform:
            close = getattr(t, "close", None)
            if close is not None:
                close()
