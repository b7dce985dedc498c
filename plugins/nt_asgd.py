"""NT-ASGD, the optimizer of the AWD-LSTM setup that MomentumRNN's Penn TreeBank experiments keep
(MomentumRNN, Appendix A.3, after Merity et al., "Regularizing and Optimizing LSTM Language Models",
Algorithm 1): SGD until the validation loss is worse than the best of all but the last `nonmono`
checks before it, then SGD whose iterates are averaged from that switch on. The average is the
model that is validated and kept.

AWD-LSTM switches by building a torch.optim.ASGD (t0 = 0, lambd = 0: its update is SGD's). That
optimizer updates with the rate of the step before (its eta is refreshed after each step), so
AWD-LSTM's per-batch rate scaling (variable BPTT) reaches the update one batch late. Here the
average is kept beside torch.optim.SGD's own step, which uses the rate of its own batch; the
iterates and their average are otherwise AWD-LSTM's."""
from typing import List, Sequence

import torch

from .validation import check_int, check_number

SWITCH = "nt_asgd"                   # the state_dict entry of the switch


def stopped_improving(previous: Sequence[float], loss: float, nonmono: int) -> bool:
    """Algorithm 1's switch: more than `nonmono` checks before this one, and `loss` worse than the best
    of all of them but the last `nonmono`."""
    return len(previous) > nonmono and loss > min(previous[:len(previous) - nonmono])


class NTASGD(torch.optim.SGD):
    """SGD (no momentum; weight decay added to the gradient, as torch.optim.SGD does) that starts
    averaging its iterates when `observe` sees the validation loss stop improving.

    - `observe(loss)`: after each validation of the iterate (AWD-LSTM: once per epoch). Returns
      True on the call that switches; later calls are ignored.
    - After the switch, each step also updates the average of the iterates since then:
      average_n = average_{n-1} + (iterate_n - average_{n-1}) / n.
    - `use_average(True)`: the parameters hold the average (to validate or save it) and the
      optimizer holds the iterate; `use_average(False)` swaps them back. A step refuses to run on
      the average.
    - `state_dict` keeps the switch, the average and which of the two the parameters hold, so a
      run stopped anywhere resumes exactly."""

    def __init__(self, params, lr: float, weight_decay: float = 0.0, nonmono: int = 5, foreach=None):
        lr = check_number(lr, "lr", low=0.0)
        weight_decay = check_number(weight_decay, "weight_decay", low=0.0)
        self.nonmono = check_int(nonmono, "nonmono", low=1)
        super().__init__(params, lr=lr, weight_decay=weight_decay, foreach=foreach)
        self.switch = {"losses": [], "averaged_steps": None, "average_in_params": False}

    @property
    def averaging(self) -> bool:
        """Whether the switch has happened."""
        return self.switch["averaged_steps"] is not None

    @property
    def averaged_steps(self) -> int:
        """Steps averaged since the switch (0 before it)."""
        return self.switch["averaged_steps"] or 0

    def _params(self) -> List[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    def observe(self, loss: float) -> bool:
        """Record the validation loss of the current iterate; True when it makes the switch."""
        if self.averaging:
            return False
        losses = self.switch["losses"]
        loss = float(loss)
        switched = stopped_improving(losses, loss, self.nonmono)
        losses.append(loss)
        if switched:
            with torch.no_grad():
                for p in self._params():
                    self.state[p]["average"] = p.detach().clone()
            self.switch["averaged_steps"] = 0
        return switched

    @torch.no_grad()
    def step(self, closure=None):
        if self.switch["average_in_params"]:
            raise RuntimeError("NTASGD.step: the parameters hold the average of the iterates; call "
                               "use_average(False) before training on")
        loss = super().step(closure)
        if self.averaging:
            self.switch["averaged_steps"] += 1
            params = self._params()
            averages = [self.state[p]["average"] for p in params]
            torch._foreach_lerp_(averages, params, 1.0 / self.switch["averaged_steps"])
        return loss

    @torch.no_grad()
    def use_average(self, average: bool) -> bool:
        """Put the average of the iterates (True) or the iterate (False) in the parameters; before
        the switch there is no average and nothing changes. Returns whether the parameters changed."""
        if not self.averaging or bool(average) == self.switch["average_in_params"]:
            return False
        for p in self._params():
            kept = self.state[p]["average"]
            iterate = p.detach().clone()
            p.copy_(kept)
            kept.copy_(iterate)
        self.switch["average_in_params"] = bool(average)
        return True

    def state_dict(self):
        """SGD's state dict in the layout torch.distributed.checkpoint needs (FSDP2; accelerate's FSDP
        checkpoints call its get_optimizer_state_dict and load into a fresh optimizer's dict in place):
        - each parameter group also holds the switch (the dict's other top-level entries are dropped);
        - before the switch, every parameter's entry holds a zero "average" of its shape, so that the
          dict a fresh optimizer gives as the template of a load has a place for the averages that a
          state saved after the switch holds (its own load drops them)."""
        state = super().state_dict()
        state["param_groups"] = [{**group, SWITCH: self._switch_copy(self.switch)}
                                 for group in state["param_groups"]]
        if not self.averaging:
            for index, p in enumerate(self._params()):
                state["state"][index] = {**state["state"].get(index, {}), "average": torch.zeros_like(p)}
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        groups = [dict(group) for group in state_dict.get("param_groups", [])]
        switches = [group.pop(SWITCH) for group in groups if SWITCH in group]
        switch = state_dict.pop(SWITCH, None)          # where states saved before 2026-12-06 hold it
        switch = switches[0] if switches else switch
        if switch is None:
            raise ValueError("NTASGD.load_state_dict: the state has no NT-ASGD switch (it was saved by "
                             "another optimizer)")
        super().load_state_dict({**state_dict, "param_groups": groups})
        self.switch = self._switch_copy(switch)
        if not self.averaging:                         # the zero placeholders of a state saved before it
            for p in self._params():
                self.state[p].pop("average", None)
                if not self.state[p]:
                    del self.state[p]

    @staticmethod
    def _switch_copy(switch):
        return {**switch, "losses": list(switch["losses"])}
