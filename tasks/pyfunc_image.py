"""MLflow pyfunc wrapper around an image classifier's ``torch.export`` program (models-from-code file).

MLflow copies this file into the logged model (with ``pyfunc_common``), so it imports no other project
code. ``predict`` takes a DataFrame with a column ``image`` of encoded files (bytes, or base64 text),
decodes each one as ``tasks/image_data.py`` does (``tests/unit/test_image_task.py`` checks that the two
agree) and returns the class names, or with ``params={"predict_method": "predict_proba"}`` a DataFrame
of class probabilities, a column per class name. The program takes pixels (0..255, float32 ``[n, c, h,
w]``).
"""

import io
import sys
import warnings

import mlflow
import numpy as np
import pandas as pd

sys.modules.pop("pyfunc_common", None)  # this model's own copy: MLflow puts its code/ first on sys.path
import pyfunc_common as common  # noqa: E402

# tasks/image_data.py's MAX_PIXELS (this file imports no project code; a unit test checks they agree).
MAX_PIXELS = 64 * 2**20
# tasks/image_transforms.py's CROP_RATIO (a unit test checks they agree).
CROP_RATIO = 0.875


class ExportedImageClassifier(mlflow.pyfunc.PythonModel):
    """Predicts one class name per row of a DataFrame whose ``image`` column holds encoded files."""

    centre_crop = False  # meta "transform": "centre_crop" (a sharded set's evaluation transform)

    def load_context(self, context):
        meta = common.meta(context)
        self.size = tuple(meta["size"])
        self.mode = {1: "L", 3: "RGB"}[int(meta["channels"])]
        self.class_labels = common.labels(meta["class_labels"])
        self.threshold = meta.get("threshold")  # two classes: the second where its probability is >= it
        # A sharded set's evaluation transform: scale to cover size / CROP_RATIO, cut the centre.
        self.centre_crop = meta.get("transform") == "centre_crop"
        self.program = common.program(context)

    def _pixels(self, data, row: int) -> np.ndarray:
        from PIL import Image

        if isinstance(data, str):  # base64 text, as a JSON client sends binary
            import base64

            data = base64.b64decode(data)
        buf = io.BytesIO(bytes(data))
        try:
            Image.MAX_IMAGE_PIXELS = MAX_PIXELS
            with warnings.catch_warnings():  # between one and two times the bound: refused just below
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                img = Image.open(buf)
            with img:
                if img.width * img.height > MAX_PIXELS:  # from the header, before a pixel is decoded
                    raise ValueError(f"{img.width} x {img.height} pixels, more than the {MAX_PIXELS:,} an image "
                                     "may have")
                if img.mode.startswith("I"):  # 16-bit grey: scaled to 8 bits, as in training
                    img = Image.fromarray((np.asarray(img).astype(np.float64).clip(0, 65535) / 257).round()
                                          .astype(np.uint8), "L")
                img = img.convert(self.mode)
                if self.centre_crop:  # tasks/image_transforms.py's centre_crop, line for line
                    h, w = self.size
                    k = max(h / CROP_RATIO / img.height, w / CROP_RATIO / img.width)
                    sw, sh = max(w, round(img.width * k)), max(h, round(img.height * k))
                    img = img.resize((sw, sh), Image.Resampling.BILINEAR)
                    left, top = (sw - w) // 2, (sh - h) // 2
                    img = img.crop((left, top, left + w, top + h))
                elif img.size != (self.size[1], self.size[0]):
                    img = img.resize((self.size[1], self.size[0]), Image.Resampling.BILINEAR)
                a = np.asarray(img, dtype=np.uint8)
        except Exception as exc:  # noqa: BLE001 - Pillow raises many kinds; all mean "not an image"
            raise ValueError(f"row {row}: column 'image' is not a decodable image: "
                             f"{type(exc).__name__}: {str(exc).replace(repr(buf), f'row {row}')}") from None
        return a[None] if a.ndim == 2 else a.transpose(2, 0, 1)

    def predict(self, context, model_input: pd.DataFrame, params=None):
        method = common.method(params)
        images = common.column(model_input, "image", "encoded image files (bytes)")
        x = np.array([self._pixels(v, i) for i, v in enumerate(images)], dtype=np.float32)
        logits = common.forward(self.program, x, rows=common.PROGRAM_ROWS)
        return common.classes(logits, self.class_labels, method, self.threshold)


mlflow.models.set_model(ExportedImageClassifier())
