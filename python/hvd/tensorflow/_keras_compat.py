"""Which Keras an object belongs to: Keras 3 (``import keras`` on
TensorFlow 2.16+) or Keras 2 (``tf_keras``, which ``tf.keras`` is when
TF_USE_LEGACY_KERAS=1, or the ``keras`` package of TensorFlow 2.15 and
older). A process may hold objects of both, so the choice is made per
object, from the package its class (or the first of its bases from a Keras
package) was defined in; nothing here imports a Keras that the process has
not imported already."""

import os
import sys


def _major(module):
    try:
        return int(str(getattr(module, "__version__", "0")).split(".")[0])
    except ValueError:  # pragma: no cover - odd version strings
        return 0


def keras3():
    """The Keras 3 module, or None when ``keras`` is missing or Keras 2."""
    try:
        import keras
    except ImportError:  # pragma: no cover - TensorFlow without Keras
        return None
    return keras if _major(keras) >= 3 else None


def legacy_tf_keras():
    """True when tf.keras is Keras 2 (tf_keras): TensorFlow reads
    TF_USE_LEGACY_KERAS the same way."""
    return os.environ.get("TF_USE_LEGACY_KERAS", "") in ("1", "true", "True")


def keras2_module():
    """The Keras 2 package that tf.keras stands for in this process:
    tf_keras (imported here when TF_USE_LEGACY_KERAS asks for it and
    nothing else is loaded yet), or a Keras 2 ``keras``; None when this
    process uses Keras 3 only."""
    mod = sys.modules.get("tf_keras")
    if mod is not None:
        return mod
    keras = sys.modules.get("keras")
    if keras is not None and _major(keras) == 2:
        return keras
    if legacy_tf_keras():
        try:
            import tf_keras
        except ImportError:  # TensorFlow then says so where tf.keras is used
            return None
        return tf_keras
    return None


def keras_package_of(obj):
    """"tf_keras", "keras2" or "keras3": the Keras that obj's class (or its
    first base defined in a Keras package) comes from; None when none."""
    for cls in type(obj).__mro__:
        top = (getattr(cls, "__module__", "") or "").split(".")[0]
        if top == "tf_keras":
            return "tf_keras"
        if top == "keras":
            mod = sys.modules.get("keras")
            return "keras2" if mod is not None and _major(mod) == 2 \
                else "keras3"
    return None


def is_keras2(obj):
    """True when obj (a model, layer, optimizer or callback) is Keras 2's."""
    return keras_package_of(obj) in ("tf_keras", "keras2")


def keras_of(obj):
    """The Keras module obj belongs to (Keras 3 when it is no Keras
    object)."""
    pkg = keras_package_of(obj)
    if pkg == "tf_keras":
        return sys.modules["tf_keras"]
    if pkg == "keras2":
        return sys.modules["keras"]
    return keras3()
