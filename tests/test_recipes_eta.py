"""The demo's expected duration and ETA (recipes/common/eta.py) on a fake clock."""
from recipes.common.eta import Schedule


def test_eta_scales_the_rest_by_this_machines_pace():
    now = [0.0]
    lines = []
    schedule = Schedule([("lm:a", 60.0), ("lm:b", 60.0), ("pmnist", 120.0)], log=lines.append,
                        clock=lambda: now[0])
    schedule.start("the reference machine")
    assert lines[0].startswith("expected duration: 4.0 min (lm 2.0 min, pmnist 2.0 min;")
    now[0] = 120.0            # the first job took twice its expected time: (120 + 120) / (60 + 120)
    schedule.finished("lm:a")
    assert "[1/3 done, 2.0 min elapsed] 4.0 min left" in lines[-1] and "1.33×" in lines[-1]
    now[0] = 150.0            # then the machine caught up: (150 + 120) / (120 + 120)
    schedule.finished("lm:b")
    assert "[2/3 done, 2.5 min elapsed] 2.2 min left" in lines[-1] and "1.12×" in lines[-1]
    now[0] = 200.0
    schedule.finished("pmnist")
    assert "[3/3 done" in lines[-1] and "0.0 min left" in lines[-1]
