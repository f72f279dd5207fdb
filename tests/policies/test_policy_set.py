"""PolicySet: a control plane's three policies, checked through the registries in one call."""

from __future__ import annotations

import pytest

from gpuyard.shared.policy import PolicyChoice, PolicyError, PolicySet


def policies(scheduling: str = "fifo", admission: str = "accept-all", placement: str = "random",
             placement_params: dict[str, object] | None = None) -> PolicySet:  # fmt: skip
    return PolicySet(
        scheduling=PolicyChoice(name=scheduling),
        admission=PolicyChoice(name=admission),
        placement=PolicyChoice(name=placement, params=placement_params or {}),
    )


def test_each_policy_is_made_with_its_parameters_by_service() -> None:
    made = policies("las", placement_params={"seed": "7"}).made()
    assert sorted(made) == ["admission", "placement", "scheduler"]
    assert made["placement"].params.seed == 7  # (text from a command line, converted)
    assert type(made["scheduler"]).__name__.lower().startswith("las")


def test_a_bad_policy_or_parameter_names_it_unless_its_service_runs_elsewhere() -> None:
    with pytest.raises(PolicyError, match="unknown admission policy 'nosuch'"):
        policies(admission="nosuch").made()
    with pytest.raises(PolicyError, match="placement policy 'random': bad parameter"):
        policies(placement_params={"sed": 1}).made()
    assert sorted(policies(admission="nosuch").made(skip={"admission"})) == [
        "placement",
        "scheduler",
    ]


def test_a_seed_goes_to_the_policies_that_draw_unless_given() -> None:
    seeded = policies("gandiva").seeded(3)
    assert seeded.scheduling.params == {"seed": 3} and seeded.placement.params == {"seed": 3}
    assert seeded.admission.params == {}  # (accept-all draws nothing)
    given = policies("gandiva", placement_params={"seed": 9}).seeded(3)
    assert given.placement.params == {"seed": 9} and given.scheduling.params == {"seed": 3}
    assert policies("fifo", placement="consolidated").seeded(3) == policies(
        "fifo", placement="consolidated"
    )
