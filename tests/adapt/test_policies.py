"""Tests of ``adapt/policies.py``: when each policy replans and what it admits."""

from __future__ import annotations

from rpeg.adapt.monitor import Signal, Trigger
from rpeg.adapt.policies import AlwaysAdapt, AnyPositiveGain, EveryK, Payback, Static, default_policies

INF = float("inf")
FIRED = [Trigger(Signal.LENGTH, False, "length drift")]


def test_when_each_policy_replans():
    assert not Static().replan(3, FIRED)
    assert AlwaysAdapt().replan(1, FIRED) and not AlwaysAdapt().replan(1, [])
    assert [EveryK(3).replan(i, []) for i in range(7)] == [False, False, False, True, False, False, True]
    assert AnyPositiveGain().replan(1, [])
    assert Payback().replan(1, FIRED) and not Payback().replan(1, [])


def test_what_each_policy_admits():
    # Static: only a feasible urgent move
    assert Static().admit(-1.0, 5.0, 1.0, urgent=True).admitted
    assert not Static().admit(10.0, 0.1, 100.0, urgent=False).admitted
    assert not Static().admit(10.0, INF, 1.0, urgent=True).admitted
    # AlwaysAdapt and EveryK: any feasible transition, gain or not
    for policy in (AlwaysAdapt(), EveryK(3)):
        assert policy.admit(-1.0, 5.0, 1.0, urgent=False).admitted
        assert not policy.admit(10.0, INF, 1.0, urgent=False).admitted
    # AnyPositiveGain: ΔL > 0 whatever the transition costs
    assert AnyPositiveGain().admit(1e-3, 1e6, 1.0, urgent=False).admitted
    assert not AnyPositiveGain().admit(0.0, 0.0, 1.0, urgent=False).admitted
    assert AnyPositiveGain().admit(-1.0, 1.0, 1.0, urgent=True).admitted
    # Payback: the admission rule with its γ
    assert Payback(0.5).admit(2.0, 1.0, 1.0, urgent=False).admitted
    assert not Payback(0.5).admit(2.0, 1.1, 1.0, urgent=False).admitted


def test_default_policies_are_the_five_of_the_comparison():
    names = [p.name for p in default_policies(0.25)]
    assert names == ["static", "always-adapt", "every-3-steps", "any-positive-gain", "payback"]
    assert default_policies(0.25)[-1] == Payback(0.25)
