"""fp8kit.torch.Linear's errors where the mistake is: dtypes as torch.nn.Linear
checks them, a checkpoint entry that is missing, mistyped or corrupt named
by its key, arguments of the wrong type named in the user's words."""

import pytest
import torch

import fp8kit.torch as ft
from fp8kit.recipe import CurrentScaling, DelayedScaling, Format

DELAYED = DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=4)
CURRENT = CurrentScaling(fp8_format=Format.HYBRID)


def _raised_by(fn):
    with pytest.raises(Exception) as info:
        fn()
    return info.value


@pytest.mark.parametrize("recipe", [DELAYED, CURRENT])
def test_mixed_dtypes_are_refused_as_nn_linear_refuses_them(recipe):
    torch.manual_seed(0)
    lin, ref = ft.Linear(32, 16), torch.nn.Linear(32, 16)
    x = torch.randn(8, 32, dtype=torch.bfloat16)
    want = _raised_by(lambda: ref(x))
    with ft.autocast(recipe=recipe):
        got = _raised_by(lambda: lin(x))
        assert type(got) is type(want) is RuntimeError
        assert "input has dtype torch.bfloat16 but weight has dtype torch.float32" in str(got)
        lin.bias = torch.nn.Parameter(lin.bias.detach().bfloat16())
        ref.bias = torch.nn.Parameter(ref.bias.detach().bfloat16())
        want = _raised_by(lambda: ref(x.float()))
        got = _raised_by(lambda: lin(x.float()))
        assert type(got) is type(want) is RuntimeError
        assert "bias has dtype torch.bfloat16 but weight has dtype torch.float32" in str(got)


@pytest.mark.parametrize("recipe", [DELAYED, CURRENT])
def test_under_torch_autocast_it_casts_as_nn_linear_does(recipe):
    """torch.autocast casts the input and the bias as torch.nn.Linear's (the
    float32 weight goes to FP8 as it is: test_torch_master_weights.py)."""
    torch.manual_seed(0)
    lin = ft.Linear(32, 16)   # float32 weights
    twin = ft.Linear(32, 16)
    with torch.no_grad():
        twin.weight.copy_(lin.weight)
    twin.bias = torch.nn.Parameter(lin.bias.detach().bfloat16())
    x = torch.randn(8, 32)
    with ft.autocast(recipe=recipe):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = lin(x)
            assert y.dtype == torch.nn.Linear(32, 16)(x).dtype == torch.bfloat16
            want = twin(x.bfloat16())
    assert torch.equal(y, want)


def test_non_tensor_arguments_are_named():
    lin = ft.Linear(32, 16)
    with ft.autocast(recipe=CURRENT):
        with pytest.raises(TypeError, match=r"fp8kit.torch.Linear: input is 'x' \(str\); it "
                                            "must be a torch.Tensor"):
            lin("x")
        lin.weight = None
        with pytest.raises(TypeError, match=r"weight is None \(NoneType\)"):
            lin(torch.randn(4, 32))


def test_autocast_arguments_are_checked_on_entry():
    with pytest.raises(TypeError, match=r"autocast: enabled is 'no' \(str\); it must be a bool"):
        with ft.autocast(enabled="no"):
            pass
    assert ft.current_recipe() is None


# ------------------------------------------------------------ checkpoints --
def _trained(recipe=DELAYED):
    torch.manual_seed(0)
    model = torch.nn.Sequential(ft.Linear(32, 16))
    with ft.autocast(recipe=recipe):
        model(torch.randn(8, 32, requires_grad=True)).sum().backward()
    return model


def _with_entry(sd, **entries):
    """The state dict with its FP8 state's entries replaced (None: removed)."""
    st = dict(sd["0._extra_state"]["states"][0], **entries)
    st = {k: v for k, v in st.items() if v is not None}
    return dict(sd, **{"0._extra_state": {"format": 3, "states": [st]}})


WHERE = r"'0._extra_state'\['states'\]\[0\]: "
NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("entries, error, match", [
    ({"scale": None}, ValueError, "the saved FP8 state has no 'scale'"),
    ({"seeded": None}, ValueError, "the saved FP8 state has no 'seeded'"),
    ({"recipe": None}, ValueError, "the saved FP8 state has no 'recipe'"),
    ({"scale": [1.0, 1.0, 1.0]}, TypeError,
     r"saved 'scale' is \[1.0, 1.0, 1.0\] \(list\); it must be a torch.Tensor"),
    ({"scale": torch.ones(3, dtype=torch.float64)}, ValueError,
     r"saved 'scale' is torch.float64 of shape \[3\] but the saved recipe needs torch.float32"),
    ({"scale": torch.tensor([1.0, NAN, 1.0])}, ValueError,
     r"saved 'scale' holds nan \(flat index 1\); scale values must be finite and > 0"),
    ({"scale": torch.tensor([1.0, 1.0, 0.0])}, ValueError, r"saved 'scale' holds 0 \(flat"),
    ({"scale": torch.tensor([-2.0, 1.0, 1.0])}, ValueError, r"saved 'scale' holds -2"),
    # scale_inv is not saved; an older entry's (format 2) is checked.
    ({"scale_inv": torch.tensor([INF, 1.0, 1.0])}, ValueError, "saved 'scale_inv' holds inf"),
    ({"scale_inv": torch.tensor([2.0, 1.0, 1.0])}, ValueError,
     r"saved 'scale_inv' holds 2 \(flat index 0\) but saved 'scale' holds .* there; scale_inv "
     r"must be 1 / scale"),
    ({"amax_history": -torch.ones(3, 4)}, ValueError,
     r"saved 'amax_history' holds -1 \(flat index 0\); amax_history values must be >= 0"),
    ({"seeded": torch.ones(3, dtype=torch.bool)}, ValueError,
     r"saved 'seeded' is torch.bool of shape \[3\]; it must be torch.float32 of shape \[3\]"),
    ({"seeded": torch.tensor([1.0, 0.5, 0.0])}, ValueError,
     r"saved 'seeded' holds 0.5 \(flat index 1\); seeded values must be 0.0 \(fresh\) or 1.0"),
    ({"seeded": [1, 1, 1]}, TypeError,
     r"saved 'seeded' is \[1, 1, 1\].*; it must be float32 \[3\] \(or a list of 3 bools\)"),
    ({"recipe": "delayed"}, TypeError, r"the saved 'recipe' is 'delayed' \(str\)"),
])
def test_a_bad_checkpoint_entry_is_named(entries, error, match):
    model = _trained()
    sd = model.state_dict()
    before = model[0].fp8_state
    with pytest.raises(error, match=WHERE + match):
        model.load_state_dict(_with_entry(sd, **entries))
    assert model[0].fp8_state is before  # a failed load changes nothing


def test_recorded_nan_and_inf_amaxes_load():
    # A tensor holding NaN or inf records that amax (the delayed-scaling
    # rule then keeps the previous scale): a real checkpoint, not a corrupt one.
    model = _trained()
    sd = model.state_dict()
    hist = sd["0._extra_state"]["states"][0]["amax_history"].clone()
    hist[0, 1], hist[2, 0] = NAN, INF
    model.load_state_dict(_with_entry(sd, amax_history=hist))
    assert torch.equal(model[0].fp8_state.amax_history.isnan(), hist.isnan())


@pytest.mark.parametrize("extra, error, match", [
    ({"format": 2}, ValueError, r"'0._extra_state' has no 'states' entry \(it must have "
                                r"'format', 'states'\): the checkpoint is incomplete"),
    ({"format": 2, "states": [], "step": 3}, ValueError,
     r"'0._extra_state' has an unknown entry 'step'"),
    ({"format": 2, "states": {}}, TypeError, r"\['states'\] is \{\} \(dict\); it must be the list"),
    ({"format": 2, "states": [7]}, TypeError,
     r"\['states'\]\[0\]: the saved FP8 state is 7 \(int\); it must be the dict"),
    ({"format": 4}, ValueError, r"'0._extra_state' is not an fp8kit Linear FP8 state of format 3"),
    (None, ValueError, r"\(got format None\)"),
])
def test_a_bad_extra_state_is_named(extra, error, match):
    model = _trained()
    sd = dict(model.state_dict(), **{"0._extra_state": extra})
    with pytest.raises(error, match=match):
        model.load_state_dict(sd)


def test_an_older_format_2_state_loads_as_it_was():
    """Format 2 saved scale_inv and seeded as a list of bools: it loads
    into the same state (scale_inv checked against scale)."""
    model = _trained()
    st = dict(model.state_dict()["0._extra_state"]["states"][0])
    old = dict(st, scale_inv=1 / st["scale"], seeded=[bool(v) for v in st["seeded"]])
    fresh = torch.nn.Sequential(ft.Linear(32, 16))
    fresh.load_state_dict(dict(model.state_dict(),
                               **{"0._extra_state": {"format": 2, "states": [old]}}))
    (got,) = fresh[0].get_extra_state()["states"]
    assert got.keys() == st.keys() and got["recipe"] == st["recipe"]
    for k in ("amax_history", "scale", "seeded"):
        assert torch.equal(got[k], st[k]), k


def test_two_entries_for_one_recipe_are_refused():
    model = _trained()
    sd = model.state_dict()
    st = sd["0._extra_state"]["states"][0]
    sd["0._extra_state"] = {"format": 3, "states": [st, st]}
    with pytest.raises(ValueError, match=r"\['states'\]\[1\] has the scaling recipe of an "
                                         "earlier entry"):
        model.load_state_dict(sd)


def test_the_state_tensors_it_shows_are_copies():
    # Resizing what fp8_state shows cannot corrupt the state the core writes.
    model = _trained()
    st = model[0].fp8_state
    scale = st.scale
    scale.resize_(0)
    st.amax_history.fill_(-1)
    assert st.scale.shape == (3,) and (st.amax_history >= 0).all()
    with ft.autocast(recipe=DELAYED):
        model(torch.randn(8, 32, requires_grad=True)).sum().backward()
