"""Small helpers shared across hyflow, under the module names verl users know (`tensordict_utils`, `device`)."""
