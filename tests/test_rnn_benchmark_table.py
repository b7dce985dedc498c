"""benchmarks/rnn.py's markdown table: each variant's ratios to nn.LSTM (and, where it ran, to
nn.LSTM without TF32), and on CUDA the share of its wall time its device was busy."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import rnn  # noqa: E402


def rows(**extra):
    base = [dict(shape="s", variant="appendix-f", seconds=0.4, peak_mib=1.0),
            dict(shape="s", variant="nn.LSTM", seconds=0.010, peak_mib=2.0),
            dict(shape="s", variant="adam", seconds=0.030, peak_mib=3.0)]
    for row in base:
        row.update(extra.get(row["variant"], {}))
    return base


def cells(line):
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_the_busy_column_is_the_device_time_over_the_wall_time():
    busy = {"nn.LSTM": dict(busy_seconds=0.009), "adam": dict(busy_seconds=0.006)}
    table = rnn.table(rows(**busy), unit="ms")
    header, _, loop, lstm, adam = table.splitlines()
    assert cells(header)[-1] == "device busy (% of fwd+bwd)"
    assert cells(lstm)[-1] == "90" and cells(adam)[-1] == "20" and cells(loop)[-1] == ""
    assert cells(adam)[2:4] == ["30.000", "3.00"]
    assert len({len(cells(line)) for line in (header, loop, lstm, adam)}) == 1


def test_without_device_times_there_is_no_busy_column():
    header = rnn.table(rows()).splitlines()[0]
    assert "busy" not in header and cells(header)[-1] == "peak memory (MiB)"


def test_the_tanh_rows_read_against_nn_rnn_without_a_loop_column():
    """--tanh: no Appendix-F loop ran, so its column goes, and nn.RNN is the baseline."""
    table = rnn.table([dict(shape="s", variant="nn.RNN", seconds=0.02, peak_mib=1.0),
                       dict(shape="s", variant="tanh-adam-cudnn", seconds=0.05, peak_mib=4.0)])
    header, _, base, fused = table.splitlines()
    assert cells(header) == ["shape", "variant", "fwd+bwd (s)", "× nn.RNN", "peak memory (MiB)"]
    assert cells(base)[1:4] == ["torch nn.RNN (tanh)", "0.020", "1.00"]
    assert cells(fused)[1:] == ["tanh adam, drive first, fused RNN kernel", "0.050", "2.50", "4"]


def test_the_tanh_variants_build_the_tanh_layers_on_their_backend(monkeypatch):
    """tanh-*-cudnn: one fused tanh-RNN call per layer; tanh-* (the step loop) and nn.RNN none."""
    from plugins.rnn import layers
    kinds = []
    fused = layers.fused_recurrence

    def counted(kind, *args, **kwargs):
        kinds.append(kind)
        return fused(kind, *args, **kwargs)

    monkeypatch.setattr(layers, "fused_recurrence", counted)
    for variant in rnn.TANH_VARIANTS:
        rnn.build(variant, T=3, B=2, D=2, H=4, L=2)()
        assert kinds == (["rnn_tanh"] * 2 if variant.endswith("-cudnn") else []), variant
        kinds.clear()
