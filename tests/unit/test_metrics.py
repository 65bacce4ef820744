import numpy as np

from evaluation.metrics import classification_metrics, latency_p95_ms


def test_classification_metrics_on_known_predictions():
    y = np.array([0, 0, 1, 1, 2, 2])
    p = np.array([0, 1, 1, 1, 2, 0])
    m = classification_metrics(y, p, 3)
    assert m["accuracy"] == 4 / 6
    assert m["class_recall"] == {"0": 0.5, "1": 1.0, "2": 0.5}
    assert m["min_class_recall"] == 0.5
    assert m["confusion_matrix"] == [[1, 1, 0], [0, 2, 0], [1, 0, 1]]


def test_absent_class_counts_as_zero_recall():
    m = classification_metrics(np.array([0, 0]), np.array([0, 0]), 2)
    assert m["class_recall"]["1"] == 0.0


def test_latency_is_positive_and_calls_one_row_at_a_time():
    shapes = []

    def predict(x):
        shapes.append(x.shape)
        return np.zeros(len(x))

    v = latency_p95_ms(predict, np.zeros((5, 3)), n=10, warmup=2)
    assert v >= 0 and len(shapes) == 12 and set(shapes) == {(1, 3)}
