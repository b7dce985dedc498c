"""Run an ONNX program (what torch.onnx.export(dynamo=True) returns) in onnxruntime."""
import torch


def onnxruntime_function(program, directory):
    """A function of the program's inputs (tensors, in order) -> its first output, run by
    onnxruntime on the model saved in `directory`."""
    import onnxruntime
    path = str(directory / "model.onnx")
    program.save(path)
    session = onnxruntime.InferenceSession(path)
    names = [i.name for i in session.get_inputs()]
    return lambda *xs: torch.from_numpy(session.run(None, {n: x.numpy() for n, x in zip(names, xs)})[0])
