import numpy as np

from tasks.metrics import classification_metrics, latency_p95_ms


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


def test_classification_metrics_equal_scikit_learns_to_the_last_bit():
    from sklearn.metrics import confusion_matrix, f1_score, recall_score

    rng = np.random.default_rng(0)
    for trial in range(200):
        k = int(rng.integers(2, 12))
        n = int(rng.integers(1, 400))
        y = rng.integers(0, k, n)
        # mostly right, sometimes a class never predicted or never present
        p = np.where(rng.random(n) < rng.random(), y, rng.integers(0, k, n))
        if trial % 5 == 0:
            p[p == 0] = 1
        if trial % 7 == 0:
            y[y == k - 1] = 0
        m = classification_metrics(y, p, k)
        labels = list(range(k))
        recall = recall_score(y, p, labels=labels, average=None, zero_division=0)
        assert m["macro_f1"] == float(f1_score(y, p, labels=labels, average="macro", zero_division=0))
        assert list(m["class_recall"].values()) == [float(r) for r in recall]
        assert m["min_class_recall"] == float(recall.min())
        assert m["confusion_matrix"] == confusion_matrix(y, p, labels=labels).tolist()
