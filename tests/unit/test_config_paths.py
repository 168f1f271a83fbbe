"""Dotted key paths into nested configs."""

from __future__ import annotations

import pytest

from sweeps.spec.config_paths import collision, get_path, split_path, with_values


@pytest.mark.parametrize("bad", ["", ".a", "a.", "a..b"])
def test_split_path_refuses_empty_parts(bad: str) -> None:
    with pytest.raises(ValueError, match="dotted key path"):
        split_path(bad)


def test_get_path_default_and_keyerror() -> None:
    config = {"a": {"b": 1}, "s": 3}
    assert get_path(config, "a.b") == 1
    assert get_path(config, "a.c", None) is None
    assert get_path(config, "s.x", "d") == "d"
    with pytest.raises(KeyError):
        get_path(config, "a.c")


def test_collision_names_the_scalar_prefix() -> None:
    config = {"training": {"opt": 0.1}, "top": 1}
    assert collision(config, "training.opt.lr") == "training.opt"
    assert collision(config, "top.lr") == "top"
    assert collision(config, "training.lr") is None
    assert collision(config, "new.deep.lr") is None


def test_with_values_deep_copies_and_keeps_order() -> None:
    config = {"z": 1, "training": {"lr": 0.1, "epochs": 3}, "a": [1]}
    out = with_values(config, {"training.lr": 0.01, "new.deep.key": "x"})
    assert list(out) == ["z", "training", "a", "new"]
    assert out["training"] == {"lr": 0.01, "epochs": 3}
    assert out["new"] == {"deep": {"key": "x"}}
    assert config["training"]["lr"] == 0.1
    out["a"].append(2)
    assert config["a"] == [1]


def test_with_values_fills_a_null_and_refuses_a_scalar() -> None:
    assert with_values({"t": None}, {"t.lr": 1}) == {"t": {"lr": 1}}
    with pytest.raises(ValueError, match="'t' holds an int, not a mapping"):
        with_values({"t": 3}, {"t.lr": 1})
