"""Train the example model of the README's quick start: an MLP on the 8x8 digits that scikit-learn
ships (no download), exported as a plain float ONNX model.

    uv run python examples/train_digits_mlp.py

writes examples/digits_mlp.onnx (MatMul/Add/Relu, opset 13) and examples/digits_mlp.eval.npz, the
held-out quarter of the digits (``pixels``: float32 [N, 64] scaled to [0, 1], ``labels``: int64),
which `qlinear quantize` finds beside the model and uses to measure the accuracy before and after.
Training is deterministic (fixed seeds), so the committed files can be remade.
"""

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier

HERE = Path(__file__).resolve().parent


def main() -> None:
    digits = load_digits()
    pixels = (digits.data / 16.0).astype(np.float32)  # the 0..16 intensities scaled to [0, 1]
    x_train, x_test, y_train, y_test = train_test_split(
        pixels, digits.target, test_size=0.25, stratify=digits.target, random_state=0)
    mlp = MLPClassifier(hidden_layer_sizes=(256, 128), max_iter=400, random_state=0)
    mlp.fit(x_train, y_train)
    print(f"scikit-learn accuracy on {len(y_test)} held-out digits: {mlp.score(x_test, y_test):.4f}")

    nodes, initializers = [], []
    current = "pixels"
    layers = list(zip(mlp.coefs_, mlp.intercepts_))
    for i, (weight, bias) in enumerate(layers, start=1):
        initializers += [numpy_helper.from_array(weight.astype(np.float32), f"fc{i}.weight"),
                         numpy_helper.from_array(bias.astype(np.float32), f"fc{i}.bias")]
        nodes += [helper.make_node("MatMul", [current, f"fc{i}.weight"], [f"fc{i}.matmul"], name=f"fc{i}.MatMul"),
                  helper.make_node("Add", [f"fc{i}.matmul", f"fc{i}.bias"], [f"fc{i}.out"], name=f"fc{i}.Add")]
        current = f"fc{i}.out"
        if i < len(layers):
            nodes.append(helper.make_node("Relu", [current], [f"fc{i}.relu"], name=f"fc{i}.Relu"))
            current = f"fc{i}.relu"
    nodes[-1].output[0] = "logits"
    graph = helper.make_graph(
        nodes, "digits_mlp",
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, ["N", 64])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7,
                              producer_name="qlinear examples/train_digits_mlp.py")
    model.doc_string = ("MLP 64-256-128-10 trained on scikit-learn's digits; input: 8x8 pixel intensities / 16 "
                        "(float32 [N, 64]); output: logits of the digits 0-9.")
    onnx.checker.check_model(model)
    onnx.save(model, HERE / "digits_mlp.onnx")
    np.savez(HERE / "digits_mlp.eval.npz", pixels=x_test, labels=y_test.astype(np.int64))

    try:
        import onnxruntime

        logits = onnxruntime.InferenceSession(str(HERE / "digits_mlp.onnx")).run(None, {"pixels": x_test})[0]
        print(f"onnxruntime accuracy of digits_mlp.onnx: {np.mean(logits.argmax(axis=1) == y_test):.4f}")
    except ImportError:
        pass


if __name__ == "__main__":
    main()
