"""Recently planned argument sets per operation, so a call that repeats one skips the Python checks.

An entry is used only for tensors that match the ones it was planned from in everything torch's own
compiled-graph guards compare (torch._C._dynamo.guards.TensorGuards, one C++ call for all tensors):
Python type, dispatch keys (device type, layout, inference mode), dtype, device index, requires_grad,
every size and every stride; and for scalar arguments equal (type included) to the planned ones. Each
plan depends only on those facts (never on data or addresses), and the arguments it was made from passed
every check, so a hit needs no check; anything else misses and is planned (and checked) from scratch.

TensorGuards is private to torch: it is tested at import and, if missing or not behaving as above, no
entry is ever made (ENABLED is False) and every call takes the operations' Python checks.
"""

import torch

SIZE = 4  # entries per operation: a loop over a few shapes stays cached; more just plans again


def _load():
    try:
        from torch._C._dynamo.guards import TensorGuards

        def make(tensors):
            return TensorGuards(*tensors, dynamic_dims_sizes=None, dynamic_dims_strides=None)

        a = torch.zeros(2, 3)
        g = make((a, a[:1]))
        ok = (g.check(torch.ones(2, 3), torch.ones(1, 3)) and not g.check(a, a[:, :1])
              and not g.check(a, a[:1].double()) and not g.check(a.t(), a[:1]) and not g.check(a, None)
              and not g.check(torch.zeros(2, 3, device="meta"), a[:1]))
        return make if ok else None
    except Exception:  # noqa: BLE001 - any failure means: do without
        return None


_make_guard = _load()
ENABLED = _make_guard is not None


class PlanCache:
    """The last SIZE plans of one operation, most recent first."""
    __slots__ = ("_entries",)

    def __init__(self):
        self._entries = ()

    def find(self, scalars, tensors):
        """The plan made for equal scalars and matching tensors (a tuple of the same length as the entry's), or None."""
        for guard, s, plan in self._entries:
            if s == scalars and guard.check(*tensors):
                return plan
        return None

    def add(self, scalars, tensors, plan):
        """Remembers `plan` for these arguments, which must have passed every check."""
        if ENABLED:
            # A new tuple replaces the old one: a concurrent find() sees one or the other, both valid.
            self._entries = ((_make_guard(tensors), scalars, plan),) + self._entries[:SIZE - 1]

    def __len__(self):
        return len(self._entries)
