"""Credentials in a URL are hidden whole: a password holding ``@`` (the userinfo ends at
the authority's last ``@``), a user part with no password (a token), secret query
parameters; everything else in the text is kept as it is."""

from __future__ import annotations

import shlex
import urllib.parse

import pytest

from sweeps.results.tracking import scrub
from sweeps.secrets import MASK, credentials_in, hide_credentials, secret_name


def test_a_password_with_an_at_sign_is_hidden_up_to_the_last_at_of_the_authority():
    uri = "http://alice:p@ss@127.0.0.1:9/"
    assert urllib.parse.urlsplit(uri).password == "p@ss"  # where the connection goes
    assert hide_credentials(uri) == "http://alice:***@127.0.0.1:9/"
    assert hide_credentials("http://alice:a@b@c@host:5000/api?x=1") == \
        "http://alice:***@host:5000/api?x=1"
    assert hide_credentials("http://alice:S3cret@host") == "http://alice:***@host"
    assert hide_credentials("http://:S3cret@host/") == "http://:***@host/"


def test_a_user_part_with_no_password_is_hidden_whole():
    assert hide_credentials("http://ghp_T0KENabc@127.0.0.1:9/") == "http://***@127.0.0.1:9/"
    assert hide_credentials("https://tok@en@host/") == "https://***@host/"


@pytest.mark.parametrize("name", ["token", "TOKEN", "access_token", "password", "passwd",
                                  "pwd", "secret", "client_secret", "key", "api_key",
                                  "apikey", "apiKey", "sig", "signature", "X-Amz-Signature",
                                  "X-Amz-Credential", "auth", "credential", "credentials"])
def test_the_value_of_a_secret_query_parameter_is_hidden(name):
    assert secret_name(name)
    uri = f"https://host:5000/mlflow?experiment=e1&{name}=QS3cret&page=2#top"
    assert hide_credentials(uri) == f"https://host:5000/mlflow?experiment=e1&{name}=***&page=2#top"
    assert hide_credentials(f"http://host/?{name}=QS3cret") == f"http://host/?{name}=***"


@pytest.mark.parametrize("name", ["experiment", "run_id", "page", "x", "keyword_count"])
def test_other_query_parameters_are_kept(name):
    assert not secret_name(name)
    assert hide_credentials(f"http://host/?{name}=v1") == f"http://host/?{name}=v1"


def test_all_at_once_in_a_shell_quoted_command_line_and_masking_again_changes_nothing():
    argv = ["sweeps", "run", "s.yaml", "--tracking-uri",
            "http://alice:p@ss@127.0.0.1:9/?token=QS3cret&x=1", "--address",
            "https://ghp_T0KENabc@ray.example:8265"]
    shown = hide_credentials(shlex.join(argv))
    assert shown == ("sweeps run s.yaml --tracking-uri "
                     "'http://alice:***@127.0.0.1:9/?token=***&x=1' "
                     "--address https://***@ray.example:8265")
    assert hide_credentials(shown) == shown
    assert hide_credentials("'http://h/?token=QS3cret'") == "'http://h/?token=***'"
    assert hide_credentials("see http://h/?token=QS3cret.") == "see http://h/?token=***."
    assert hide_credentials("http://h/?token=Q'S3cret") == "http://h/?token=***"


@pytest.mark.parametrize("text", [
    "http://mlflow.example:5000/",
    "https://host/path/a@b?experiment=e#frag",
    "sqlite:///results/my@sweep/mlflow.db",
    "sqlite:////data/team@lab/mlflow.db",
    "/home/alice/results/a@b/mlflow.db",
    "results/sweep/mlflow.db",
    "mail alice@example.org about it",
    "sweeps run s.yaml --token=abc",  # an option, not a query parameter
    "http://alice:@host/",  # an empty password: nothing to hide
    "",
])
def test_a_text_without_credentials_is_kept_as_it_is(text):
    assert hide_credentials(text) == text
    assert credentials_in(text) == []


def test_an_error_message_loses_every_credential_of_the_uri():
    uri = "http://alice:p@ss@127.0.0.1:9/?token=QS3cret"
    assert credentials_in(uri) == ["QS3cret", "p@ss"]
    error = f"cannot reach {uri}: login p@ss refused (token QS3cret)"
    assert scrub(error, uri) == f"cannot reach http://alice:{MASK}@127.0.0.1:9/?token=" \
        f"{MASK}: login {MASK} refused (token {MASK})"
    assert scrub("refused ghp_T0KENabc", "http://ghp_T0KENabc@h/") == "refused ***"
