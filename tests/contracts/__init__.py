"""Port contracts written once, run against every adapter (tests/unit and tests/integration)."""

import pytest

# These modules hold test bodies but are not test files: ask for pytest's assertion messages.
pytest.register_assert_rewrite(
    "tests.contracts.broadcaster",
    "tests.contracts.dead_letter_sink",
    "tests.contracts.event_source",
    "tests.contracts.factories",
    "tests.contracts.state_store",
)
