"""Tests for hyflow.fields: every travelling field is named once, with shape, dtype, kind and meaning."""

import re

import pytest

import hyflow.fields as F
from hyflow.fields import FIELDS, META_FIELDS, NON_TENSOR_FIELDS, TENSOR_FIELDS, FieldSpec, describe

INTERFACE_TENSOR_FIELDS = [
    "input_ids",
    "attention_mask",
    "position_ids",
    "prompts",
    "responses",
    "response_mask",
    "old_log_probs",
    "ref_log_prob",
    "rollout_log_probs",
    "entropys",
    "values",
    "token_level_scores",
    "token_level_rewards",
    "advantages",
    "returns",
]
INTERFACE_NON_TENSOR_FIELDS = [
    "uid",
    "data_source",
    "reward_model",
    "extra_info",
    "raw_prompt",
    "agent_name",
    "index",
    "tools_kwargs",
    "interaction_kwargs",
    "num_turns",
]


@pytest.mark.parametrize("name", INTERFACE_TENSOR_FIELDS)
def test_every_tensor_field_of_the_shared_interface_is_listed_as_a_tensor(name):
    assert FIELDS[name].kind == "tensor"
    assert name in TENSOR_FIELDS


@pytest.mark.parametrize("name", INTERFACE_NON_TENSOR_FIELDS)
def test_every_non_tensor_field_of_the_shared_interface_is_listed_as_non_tensor(name):
    assert FIELDS[name].kind == "non_tensor"
    assert name in NON_TENSOR_FIELDS


def test_every_upper_case_constant_is_a_field_and_every_field_has_a_constant():
    constants = {
        value
        for name, value in vars(F).items()
        if name.isupper() and isinstance(value, str) and not name.startswith("_")
    }
    assert constants == set(FIELDS)
    assert F.RESPONSE_MASK == "response_mask"
    assert F.OLD_LOG_PROBS == "old_log_probs"
    assert F.UID == "uid"


def test_every_spec_is_keyed_by_its_own_name_and_has_a_meaning():
    for name, spec in FIELDS.items():
        assert isinstance(spec, FieldSpec)
        assert spec.name == name
        assert spec.kind in ("tensor", "non_tensor", "meta")
        assert spec.meaning and spec.dtype


def test_tensor_and_non_tensor_shapes_start_with_the_batch_dimension_and_meta_has_none():
    for spec in FIELDS.values():
        if spec.kind == "meta":
            assert spec.shape == ""
        else:
            assert re.fullmatch(r"\(B(, [PRT])?(, Lm, k)?,?\)", spec.shape), spec


def test_the_three_kinds_partition_the_fields():
    assert set(TENSOR_FIELDS) | set(NON_TENSOR_FIELDS) | set(META_FIELDS) == set(FIELDS)
    assert len(TENSOR_FIELDS) + len(NON_TENSOR_FIELDS) + len(META_FIELDS) == len(FIELDS)


def test_every_field_appears_in_the_module_docstring_table():
    for name in FIELDS:
        assert re.search(rf"^\| {name} +\|", F.__doc__, flags=re.MULTILINE), name


def test_describe_gives_one_line_with_kind_dtype_shape_and_meaning():
    line = describe("response_mask")
    assert line == "response_mask (tensor int64 (B, R)): 1 = model token in the loss, 0 = pad / tool / user token"
    assert "\n" not in line
    assert describe("temperature").startswith("temperature (meta float): ")


def test_describe_of_an_unknown_key_says_so_and_suggests_the_closest_field():
    assert describe("old_log_prob") == (
        "old_log_prob (not a hyflow field, see hyflow/fields.py; did you mean 'old_log_probs'?)"
    )
    assert describe("zzzz") == "zzzz (not a hyflow field, see hyflow/fields.py)"
