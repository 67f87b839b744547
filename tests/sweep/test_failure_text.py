"""The driver's one-line reason for a failed trial (a real Ray task error, no cluster needed)."""

from __future__ import annotations

from ray.exceptions import RayTaskError

from k3scale.errors import K3ScaleError
from k3scale.sweep.driver import failure_text


def test_a_ray_task_error_is_named_by_its_cause():
    cause = K3ScaleError("the dataset's vocabulary (8192) is larger than model.vocab_size (512)")
    wrapped = RayTaskError("_run_payload_entry", "Traceback (most recent call last): ...", cause)
    text = failure_text(wrapped.as_instanceof_cause())
    assert text == f"K3ScaleError: {cause}"


def test_a_plain_error_gives_its_first_line():
    assert failure_text(ValueError("bad value\nmore detail")) == "ValueError: bad value"
