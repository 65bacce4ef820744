"""scripts/team.py without servers or processes: secrets live in 0600 files and never on stdout,
and an older trust cluster's rules become password rules. (`down` and the exports with real
processes: tests/integration/test_team_procs.py; the servers themselves, with their passwords:
tests/integration/test_team_mode.py.)"""

from __future__ import annotations

import pytest

from tests.conftest import load_script


@pytest.fixture(scope="module")
def team():
    return load_script("team")


def test_secrets_are_drawn_once_into_an_owner_only_file(team, tmp_path):
    drawn = team.load_secrets(tmp_path, create=True)
    path = tmp_path / team.SECRETS_FILE
    assert path.stat().st_mode & 0o777 == 0o600
    assert team.load_secrets(tmp_path) == drawn  # the same on every later up
    assert len({drawn["postgres_password"], drawn["mlflow_password"], drawn["prefect_auth_string"]}) == 3
    assert drawn["prefect_auth_string"].startswith("trainflow:") and len(drawn["mlflow_password"]) >= 32
    path.chmod(0o644)
    with pytest.raises(team.TeamError, match=r"readable by others \(mode 644\); `chmod 600"):
        team.load_secrets(tmp_path)


def test_trust_rules_of_an_older_cluster_become_password_rules(team):
    old = ("# TYPE  DATABASE  USER  ADDRESS  METHOD\n"
           "local   all       all            trust\n"
           "host    all       all   127.0.0.1/32  trust  # from initdb -A trust\n"
           "host    replication all ::1/128  trust\n")
    new = team.hba_without_trust(old)
    assert not [line for line in new.splitlines() if "trust" in line.partition("#")[0]]
    assert new.count("scram-sha-256") == 3
    assert new.splitlines()[0] == "# TYPE  DATABASE  USER  ADDRESS  METHOD"
    assert "127.0.0.1/32  scram-sha-256  # from initdb -A trust" in new
    assert team.hba_without_trust(new) is None  # already passwords: nothing to do

