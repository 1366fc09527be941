from __future__ import annotations

from pathlib import Path

import pytest

from bridge.app.config import Endpoint, bridge_amqp, resolve
from policies.errors import ConfigError


def test_defaults() -> None:
    s = resolve({}, environ={})
    assert s.broker == "rabbitmq"
    assert s.upstream_stomp == Endpoint("127.0.0.1", 61613)
    assert s.log_format == "console" and s.log_level == "info"


def test_flag_beats_environment_beats_file(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("broker: activemq\nupstream_stomp: stomp://file:1\nlog-level: debug\n"
                   "stomp-listen: 0.0.0.0:7000\n")
    env = {"JMS_BRIDGE_UPSTREAM_STOMP": "stomp://u:p@env:2", "JMS_BRIDGE_LOG_LEVEL": "error"}
    s = resolve({"log-level": "warning"}, config_file=str(cfg), environ=env)
    assert s.broker == "activemq"  # file only
    assert s.upstream_stomp == Endpoint("env", 2, "u", "p")  # env over file
    assert s.log_level == "warning"  # flag over env
    assert s.stomp_listen == Endpoint("0.0.0.0", 7000)


def test_config_file_from_environment(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("broker: activemq\n")
    assert resolve({}, environ={"JMS_BRIDGE_CONFIG": str(cfg)}).broker == "activemq"


def test_amqp_url_with_vhost() -> None:
    s = resolve({"upstream-amqp": "amqp://guest:gu%40st@127.0.0.1:5672/%2F"}, environ={})
    assert s.upstream_amqp == Endpoint("127.0.0.1", 5672, "guest", "gu@st", "/")


def test_staging_level_prefetch() -> None:
    assert resolve({}, environ={}).staging_level_prefetch == 1000
    env = {"JMS_BRIDGE_STAGING_LEVEL_PREFETCH": "250"}
    assert resolve({}, environ=env).staging_level_prefetch == 250


def test_staging_queue_type(tmp_path: Path) -> None:
    assert resolve({}, environ={}).staging_queue_type == "classic"
    env = {"JMS_BRIDGE_STAGING_QUEUE_TYPE": "Quorum"}
    assert resolve({}, environ=env).staging_queue_type == "quorum"
    cfg = tmp_path / "c.yaml"
    cfg.write_text("staging-queue-type: quorum\n")
    assert resolve({}, config_file=str(cfg), environ={}).staging_queue_type == "quorum"
    assert resolve({"staging-queue-type": "classic"}, config_file=str(cfg),
                   environ={}).staging_queue_type == "classic"


def test_staged_catalogue(tmp_path: Path) -> None:
    assert resolve({}, environ={}).staged_catalogue is None
    env = {"JMS_BRIDGE_STAGED_CATALOGUE": "/data/staged.db"}
    assert resolve({}, environ=env).staged_catalogue == "/data/staged.db"
    cfg = tmp_path / "c.yaml"
    cfg.write_text("staged-catalogue: /var/lib/jms-bridge/staged.db\n")
    assert resolve({}, config_file=str(cfg), environ={}).staged_catalogue == \
        "/var/lib/jms-bridge/staged.db"


def test_management_url() -> None:
    s = resolve({}, environ={"JMS_BRIDGE_UPSTREAM_MANAGEMENT": "http://mon:pw@10.0.0.5:15672"})
    assert s.upstream_management == Endpoint("10.0.0.5", 15672, "mon", "pw")


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        ({"broker": "kafka"}, ["broker", "kafka"]),
        ({"upstream-stomp": "http://x:1"}, ["upstream-stomp", "stomp://"]),
        ({"upstream-stomp": "stomp://host"}, ["upstream-stomp", "HOST:PORT"]),
        ({"upstream-stomp": "stomp://host:99999"}, ["upstream-stomp"]),
        ({"stomp-listen": "nohost"}, ["stomp-listen", "HOST:PORT"]),
        ({"admin-listen": "h:0"}, ["admin-listen"]),
        ({"log-format": "xml"}, ["log-format", "xml"]),
        ({"staging-level-prefetch": "0"}, ["staging-level-prefetch", "1 to 65535"]),
        ({"staging-level-prefetch": "70000"}, ["staging-level-prefetch", "1 to 65535"]),
        ({"staging-level-prefetch": "lots"}, ["staging-level-prefetch", "'lots'"]),
        ({"staging-queue-type": "stream"}, ["staging-queue-type", "classic, quorum", "'stream'"]),
        ({"activemq-scheduler": "broker"}, ["activemq-scheduler", "take, passthrough"]),
        ({"activemq-scheduler": "passthrough"}, ["activemq-scheduler", "RabbitMQ has none"]),
        (
            {"broker": "activemq", "staging-queue-type": "quorum"},
            ["staging-queue-type", "ActiveMQ has none"],
        ),
        (
            {"broker": "activemq", "upstream-amqp": "amqp://a:b@h:1/v"},
            ["only for --broker rabbitmq"],
        ),
        ({"upstream-management": "https://h:1"}, ["upstream-management", "http://"]),
        ({"staged-catalogue": "  "}, ["staged-catalogue", "path of a file"]),
        ({"staged-catalogue": "/var/lib/jms-bridge/"}, ["staged-catalogue", "path of a file"]),
        (
            {"broker": "activemq", "upstream-management": "http://a:b@h:1"},
            ["upstream-management", "only for --broker rabbitmq"],
        ),
    ],
)
def test_bad_values_name_the_setting(flags: dict[str, str], words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        resolve(flags, environ={})
    for w in words:
        assert w in str(err.value)


def test_bad_environment_value_names_the_source() -> None:
    with pytest.raises(ConfigError, match="environment"):
        resolve({}, environ={"JMS_BRIDGE_BROKER": "nope"})


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("broker: [unclosed\n", ["line", "column"]),
        ("- a\n- b\n", ["mapping"]),
        ("brokr: rabbitmq\n", ["unknown setting", "brokr"]),
        ("broker: kafka\n", ["kafka"]),
    ],
)
def test_broken_config_files(tmp_path: Path, text: str, words: list[str]) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as err:
        resolve({}, config_file=str(cfg), environ={})
    assert str(cfg) in str(err.value)
    for w in words:
        assert w in str(err.value)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        resolve({}, config_file=str(tmp_path / "absent.yaml"), environ={})


def test_upstream_node_lists() -> None:
    s = resolve({"upstream-stomp": "stomp://u:p@a:61613, stomp://b:61614",
                 "upstream-amqp": "amqp://u:p@a:5672/v,amqp://b:5673"}, environ={})
    assert str(s.upstream_stomp) == "a:61613,b:61614"
    assert [(e.host, e.port, e.user, e.password) for e in s.upstream_stomp.every()] == [
        ("a", 61613, "u", "p"), ("b", 61614, "u", "p")]
    assert s.upstream_amqp is not None
    assert [(e.host, e.vhost, e.user) for e in s.upstream_amqp.every()] == [
        ("a", "v", "u"), ("b", "v", "u")]
    derived = bridge_amqp(resolve({"upstream-stomp": "stomp://a:61613,stomp://b:61613"},
                                  environ={}))
    assert [(e.host, e.port) for e in derived.every()] == [("a", 5672), ("b", 5672)]
    ca = resolve({"upstream-stomp": "stomp+ssl://a:1,stomp+ssl://b:2", "upstream-ca": "/x.pem"},
                 environ={})
    assert [e.ca_file for e in ca.upstream_stomp.every()] == ["/x.pem", "/x.pem"]
    assert resolve({}, environ={}).upstream_stomp.every() == (Endpoint("127.0.0.1", 61613),)


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        ({"upstream-stomp": "stomp://a:1,"}, ["upstream-stomp", "empty address"]),
        ({"upstream-stomp": "stomp://a:1,stomp+ssl://b:2"}, ["upstream-stomp", "same scheme"]),
        ({"upstream-stomp": "stomp://a:1,b:2"}, ["upstream-stomp", "stomp://"]),
        ({"broker": "activemq", "upstream-stomp": "stomp://a:1,stomp://b:2"},
         ["upstream-stomp", "RabbitMQ cluster"]),
    ],
)
def test_bad_upstream_node_lists(flags: dict[str, str], words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        resolve(flags, environ={})
    for w in words:
        assert w in str(err.value)


def test_amqp_tls_listen(tmp_path: Path) -> None:
    env = {"JMS_BRIDGE_AMQP_TLS_LISTEN": "0.0.0.0:5674", "JMS_BRIDGE_TLS_CERT": "/tls/tls.crt",
           "JMS_BRIDGE_TLS_KEY": "/tls/tls.key"}
    assert resolve({}, environ=env).amqp_tls_listen == Endpoint("0.0.0.0", 5674)
    with pytest.raises(ConfigError, match=r"^amqp-tls-listen: needs --tls-cert and --tls-key"):
        resolve({"amqp-tls-listen": "127.0.0.1:5674"}, environ={})
    with pytest.raises(ConfigError, match=r"^amqp-tls-listen: the AMQP 0-9-1 front-end is only"):
        resolve({"broker": "activemq"}, environ=env)
    with pytest.raises(ConfigError, match=r"amqp-tls-listen"):
        resolve({"amqp-tls-listen": "nowhere"}, environ={})


def test_broker_credentials_fill_urls_that_carry_none() -> None:
    """JMS_BRIDGE_BROKER_USER / _PASSWORD: a Kubernetes Secret's user and password keys (the
    broker chart's own Secret) without a URL to percent-encode them into."""
    env = {"JMS_BRIDGE_UPSTREAM_STOMP": "stomp://rabbitmq:61613,stomp://rabbitmq-1:61613",
           "JMS_BRIDGE_UPSTREAM_AMQP": "amqp://rabbitmq:5672/%2F",
           "JMS_BRIDGE_UPSTREAM_MANAGEMENT": "http://rabbitmq:15672",
           "JMS_BRIDGE_BROKER_USER": "user", "JMS_BRIDGE_BROKER_PASSWORD": "p@ss:w/rd %"}
    s = resolve({}, environ=env)
    assert s.upstream_amqp is not None and s.upstream_management is not None
    for endpoint in (*s.upstream_stomp.every(), s.upstream_amqp, s.upstream_management):
        assert (endpoint.user, endpoint.password) == ("user", "p@ss:w/rd %")
    assert bridge_amqp(s).user == "user" and bridge_amqp(s).password == "p@ss:w/rd %"
    # credentials in a URL win: they were written for that endpoint
    env["JMS_BRIDGE_UPSTREAM_STOMP"] = "stomp://bridge:s3cret@rabbitmq:61613"
    s = resolve({}, environ=env)
    assert (s.upstream_stomp.user, s.upstream_stomp.password) == ("bridge", "s3cret")
    assert s.upstream_amqp is not None and s.upstream_amqp.user == "user"
    # a password alone keeps the URL's user (or the broker's default user)
    s = resolve({}, environ={"JMS_BRIDGE_BROKER_PASSWORD": "pw"})
    assert (s.upstream_stomp.user, s.upstream_stomp.password) == (None, "pw")
    assert bridge_amqp(s).user == "guest" and bridge_amqp(s).password == "pw"


def test_blank_broker_credentials_are_refused_by_name() -> None:
    for name in ("USER", "PASSWORD"):
        with pytest.raises(ConfigError, match=f"broker-{name.lower()} .*environment"):
            resolve({}, environ={f"JMS_BRIDGE_BROKER_{name}": "  "})
