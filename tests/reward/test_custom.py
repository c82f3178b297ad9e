"""custom_reward_function: loading a user's function from a file, with clear start-up errors."""

import pickle
import textwrap

import pytest

from hyflow.reward.custom import load_custom_function

USER_FILE = textwrap.dedent(
    """
    def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
        return float(solution_str == ground_truth) + bonus


    def too_few_arguments(solution_str):
        return 0.0


    def batch_score(data_sources, solution_strs, ground_truths, extra_infos):
        return [0.0] * len(solution_strs)
    """
)


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(USER_FILE)
    return str(path)


def test_a_custom_function_is_called_with_its_reward_kwargs(user_file):
    fn = load_custom_function(user_file, "compute_score", {"bonus": 0.5})
    assert fn(data_source="x", solution_str="a", ground_truth="a", extra_info=None) == 1.5


def test_a_loaded_function_pickles_by_path_and_works_after_unpickling(user_file):
    fn = pickle.loads(pickle.dumps(load_custom_function(user_file)))
    assert fn(data_source="x", solution_str="a", ground_truth="b") == 0.0


def test_a_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match=r"custom_reward_function\.path=.*does not exist"):
        load_custom_function(str(tmp_path / "nope.py"))


def test_a_missing_function_lists_the_functions_in_the_file(user_file):
    with pytest.raises(ValueError, match=r"name='score'.*\['batch_score', 'compute_score', 'too_few_arguments'\]"):
        load_custom_function(user_file, "score")


def test_a_function_that_cannot_take_the_scoring_arguments_is_rejected(user_file):
    with pytest.raises(ValueError, match="cannot be called as too_few_arguments"):
        load_custom_function(user_file, "too_few_arguments")
    with pytest.raises(ValueError, match="reward_kwargs"):
        load_custom_function(user_file, "batch_score", {"bonus": 1.0}, batched=True)


def test_a_file_that_fails_to_import_names_the_file(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("import no_such_module_here\n")
    with pytest.raises(ValueError, match=r"broken\.py.*ModuleNotFoundError"):
        load_custom_function(str(path))
