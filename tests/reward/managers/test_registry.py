"""The reward-manager registry reads like verl's: a name -> class dict, `@register(name)`, named errors."""

import pytest

from hyflow.reward.managers import REWARD_MANAGER_REGISTRY, get_reward_manager_cls, register


def test_the_built_in_managers_are_in_the_registry_dict():
    get_reward_manager_cls("naive")  # the first look-up imports every manager module
    assert {"naive", "batch", "prime", "dapo"} <= set(REWARD_MANAGER_REGISTRY)


def test_verls_register_decorator_adds_a_class_under_its_name_and_refuses_a_second_class():
    @register("test_registry_manager")
    class First:
        pass

    try:
        assert get_reward_manager_cls("test_registry_manager") is First
        with pytest.raises(ValueError, match="is taken by"):

            @register("test_registry_manager")
            class Second:
                pass

        assert REWARD_MANAGER_REGISTRY["test_registry_manager"] is First
    finally:
        del REWARD_MANAGER_REGISTRY["test_registry_manager"]


def test_an_unknown_manager_is_named_with_the_registered_ones():
    with pytest.raises(ValueError, match=r"Unknown reward manager: fancy .*'naive'"):
        get_reward_manager_cls("fancy")
