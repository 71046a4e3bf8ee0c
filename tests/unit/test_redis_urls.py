"""What each Redis URL form names: one server, a Sentinel group or a Cluster's seeds."""

from __future__ import annotations

import pytest

from eco_router.adapters.redis.connections.topology import (
    ClusterSeeds,
    Credentials,
    SentinelGroup,
    Standalone,
    parse_redis_url,
)


class TestStandalone:
    @pytest.mark.parametrize(
        "url", ["redis://localhost:6379/0", "rediss://u:p@h:6380/1", "unix:///run/redis.sock"]
    )
    def test_one_server_is_left_to_redis_py(self, url: str) -> None:
        assert parse_redis_url(url) == Standalone(url)


class TestSentinel:
    def test_every_part_is_read(self) -> None:
        url = (
            "redis+sentinel://router:p%40ss@s1:26379,s2:26380,[::1]/mymaster/3"
            "?sentinel_username=watch&sentinel_password=sp"
        )

        assert parse_redis_url(url) == SentinelGroup(
            sentinels=(("s1", 26379), ("s2", 26380), ("::1", 26379)),
            master_name="mymaster",
            db=3,
            credentials=Credentials("router", "p@ss"),
            sentinel_username="watch",
            sentinel_password="sp",
        )

    def test_the_database_defaults_to_0_and_a_password_alone_is_a_password(self) -> None:
        group = parse_redis_url("redis+sentinel://secret@s1/primary")

        assert isinstance(group, SentinelGroup)
        assert (group.db, group.credentials.password, group.credentials.username) == (
            0,
            "secret",
            None,
        )

    def test_tls_covers_the_sentinels_unless_told_otherwise(self) -> None:
        url = "rediss+sentinel://s1/m?ssl_ca_certs=/ca.pem&ssl_cert_reqs=required"
        group = parse_redis_url(url)
        plain_sentinels = parse_redis_url(url + "&sentinel_ssl=false")

        assert isinstance(group, SentinelGroup)
        assert isinstance(plain_sentinels, SentinelGroup)
        assert group.credentials.tls
        assert group.sentinel_tls
        assert group.credentials.tls_options == {
            "ssl_ca_certs": "/ca.pem",
            "ssl_cert_reqs": "required",
        }
        assert not plain_sentinels.sentinel_tls

    @pytest.mark.parametrize(
        ("url", "problem"),
        [
            ("redis+sentinel://s1", "names no master"),
            ("redis+sentinel://s1/m/0/extra", "path must be /MASTER-NAME or /MASTER-NAME/DB"),
            ("redis+sentinel://s1:0/m", "port of 's1:0' must be a number"),
            ("redis+sentinel://:1/m", "host ':1' names no host"),
            ("redis+sentinel://[::1/m", "is not a valid URL"),
            ("rediss+sentinel://s1/m?ssl_cert_reqs=maybe", "ssl_cert_reqs must be one of"),
            ("rediss+sentinel://s1/m?sentinel_ssl=x", "option sentinel_ssl must be true or false"),
            ("redis+sentinel://s1/m?db=1&db=2", "option 'db' is given twice"),
        ],
    )
    def test_a_mistake_is_named(self, url: str, problem: str) -> None:
        with pytest.raises(ValueError, match="^" + problem.replace("[", r"\[")):
            parse_redis_url(url)


class TestCluster:
    def test_seeds_default_to_port_6379(self) -> None:
        assert parse_redis_url("rediss+cluster://u:p@n1:7000,n2") == ClusterSeeds(
            nodes=(("n1", 7000), ("n2", 6379)), credentials=Credentials("u", "p", tls=True)
        )

    @pytest.mark.parametrize("url", ["redis+cluster://n1/1", "redis+cluster://n1/x"])
    def test_only_database_0_exists(self, url: str) -> None:
        with pytest.raises(ValueError, match="only database 0"):
            parse_redis_url(url)

    def test_sentinel_options_are_not_cluster_options(self) -> None:
        with pytest.raises(ValueError, match="unknown option 'sentinel_password'"):
            parse_redis_url("redis+cluster://n1?sentinel_password=x")
