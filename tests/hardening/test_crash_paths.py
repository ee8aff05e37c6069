"""fp8kit.torch's crash-prone paths (crash_paths_torch.py), each run in a
child process: a segfault or abort there fails one test, with a
reproducer."""

import pytest

from child_process import DEVICES, functions

# One test per extension class (check_extension_classes_listed keeps the
# list complete), so that one crashing class does not hide another.
EXTENSION_CLASSES = ["Quantizer", "Float8Quantizer", "Float8CurrentScalingQuantizer",
                     "Float8BlockQuantizer", "LinearState"]
FUNCTIONS = [f for f in functions("crash_paths_torch")
             if f not in ("check_uninitialised_extension_object",
                          "check_extension_classes_listed")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cls_name", EXTENSION_CLASSES)
def test_uninitialised_extension_object(child, cls_name, device):
    child.run("crash_paths_torch", "check_uninitialised_extension_object", cls_name=cls_name,
              device=device)


def test_extension_classes_listed(child):
    child.run("crash_paths_torch", "check_extension_classes_listed", listed=EXTENSION_CLASSES,
              device="cpu")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("function", FUNCTIONS)
def test_crash_path(child, function, device):
    child.run("crash_paths_torch", function, device=device)
