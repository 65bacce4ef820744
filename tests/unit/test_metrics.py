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


def test_ranking_metrics_equal_scikit_learns():
    from sklearn.metrics import average_precision_score, balanced_accuracy_score, log_loss, roc_auc_score

    from tasks.metrics import ranking_metrics

    rng = np.random.default_rng(1)
    for trial in range(60):
        k = 2 if trial % 2 else int(rng.integers(3, 7))
        n = int(rng.integers(20, 300))
        y = rng.integers(0, k, n)
        y[:k] = np.arange(k)  # every class present
        logits = rng.normal(size=(n, k)) + 1.5 * np.eye(k)[y] * rng.random()
        if trial % 3 == 0:
            logits = np.round(logits, 1)  # ties
        p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
        m = ranking_metrics(y, p)
        if k == 2:
            rare = 0 if (y == 1).sum() > (y == 0).sum() else 1
            assert np.isclose(m["roc_auc"], roc_auc_score(y, p[:, 1]))
            assert np.isclose(m["average_precision"], average_precision_score(y == rare, p[:, rare]))
        else:
            assert np.isclose(m["roc_auc"], roc_auc_score(y, p, multi_class="ovr", average="macro"))
            assert np.isclose(m["average_precision"],
                              average_precision_score(np.eye(k)[y], p, average="macro"))
        assert np.isclose(m["log_loss"], log_loss(y, p, labels=list(range(k))))
        assert np.isclose(classification_metrics(y, p.argmax(1), k)["balanced_accuracy"],
                          balanced_accuracy_score(y, p.argmax(1)))


def test_a_constant_predictor_ranks_at_chance():
    from tasks.metrics import ranking_metrics

    y = np.array([0] * 95 + [1] * 5)
    m = ranking_metrics(y, np.tile([0.95, 0.05], (100, 1)))
    assert m["roc_auc"] == 0.5
    assert np.isclose(m["average_precision"], 0.05)  # the rarer class's share
    one = classification_metrics(y, np.zeros(100, dtype=int), 2)
    assert one["predicted_classes"] == 1 and one["balanced_accuracy"] == 0.5 and one["accuracy"] == 0.95


def test_threshold_tuning_finds_the_best_cut_and_prefers_one_near_half():
    from tasks.metrics import labels_of, tune_threshold

    # class 1 is rare and the model gives it low probabilities: the best cut is well below 0.5
    y = np.array([0] * 90 + [1] * 10)
    p1 = np.r_[np.linspace(0.0, 0.2, 90), np.linspace(0.25, 0.4, 10)]
    t, best = tune_threshold(y, p1, "macro_f1")
    assert 0.2 < t < 0.25 and best == 1.0
    assert (labels_of(np.c_[1 - p1, p1], t) == y).all()
    assert (labels_of(np.c_[1 - p1, p1]) == 0).all()  # the argmax misses every rare row
    for metric in ("accuracy", "balanced_accuracy"):
        assert 0.2 < tune_threshold(y, p1, metric)[0] < 0.25
    # perfectly separated at 0.5 already: of the equal cuts, the one nearest 0.5
    t, _ = tune_threshold(np.array([0, 0, 1, 1]), np.array([0.1, 0.2, 0.8, 0.9]), "accuracy")
    assert 0.2 < t < 0.8 and abs(t - 0.5) <= 0.3
    # brute force agrees on random data
    rng = np.random.default_rng(2)
    for _ in range(20):
        y = (rng.random(200) < 0.2).astype(int)
        p1 = np.clip(0.3 * y + rng.random(200) * 0.7, 0, 1).round(2)
        for metric in ("accuracy", "balanced_accuracy", "macro_f1"):
            t, best = tune_threshold(y, p1, metric)
            brute = max(classification_metrics(y, (p1 >= c).astype(int), 2)[metric]
                        for c in np.r_[np.unique(p1), 1.01])
            assert np.isclose(best, brute)
            assert np.isclose(classification_metrics(y, (p1 >= t).astype(int), 2)[metric], best)
