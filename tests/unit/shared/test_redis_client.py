"""`--redis-sentinel` values: what parses, and what each malformed value is told."""

from __future__ import annotations

import pytest

from pagedserve.shared.options import OPTIONS
from pagedserve.shared.redis_client import RedisTarget, SentinelAddress


def test_sentinel_address_parses_hosts_and_service() -> None:
    address = SentinelAddress.parse("10.0.0.1:26379, sentinel-2:26380,[::1]:26381/primary")
    assert address.hosts == (("10.0.0.1", 26379), ("sentinel-2", 26380), ("::1", 26381))
    assert address.service_name == "primary"
    assert str(SentinelAddress.parse(str(address))) == str(address)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("10.0.0.1:26379", "expected HOST:PORT[,HOST:PORT...]/SERVICE"),
        ("10.0.0.1:26379/", "expected HOST:PORT[,HOST:PORT...]/SERVICE"),
        ("/primary", "expected HOST:PORT[,HOST:PORT...]/SERVICE"),
        ("10.0.0.1/primary", "'10.0.0.1' is not HOST:PORT"),
        ("10.0.0.1:0/primary", "'10.0.0.1:0' is not HOST:PORT with a port in 1..65535"),
        ("a:1,:2/primary", "':2' is not HOST:PORT"),
    ],
)
def test_malformed_sentinel_values_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="--redis-sentinel") as raised:
        SentinelAddress.parse(text)
    assert message in str(raised.value)


def test_target_without_sentinel_is_the_url() -> None:
    target = RedisTarget.of(None)
    assert target.sentinel is None
    assert target.describe() == OPTIONS["redis_url"].default
    via = RedisTarget.of("redis://:secret@ignored:1/3", "h:26379/primary")
    assert via.describe() == "the primary of 'primary' (sentinels h:26379/primary)"


def test_option_reads_its_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    option = OPTIONS["redis_sentinel"]
    assert option.default is None
    monkeypatch.setenv("PAGEDSERVE_REDIS_SENTINEL", "s:26379/primary")
    assert option.default_now() == "s:26379/primary"
