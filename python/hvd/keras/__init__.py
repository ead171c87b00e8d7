"""hvd.keras: Horovod's other name for hvd.tensorflow.keras (as
``horovod.keras`` is for the Keras TensorFlow ships), so that
``import hvd.keras as hvd`` gives the same functions, classes and
``callbacks`` as ``import hvd.tensorflow.keras as hvd``."""

import hvd.tensorflow.keras as _impl
from hvd.tensorflow.keras import *  # noqa: F401,F403
from hvd.tensorflow.keras import __all__  # noqa: F401
from hvd.keras import callbacks  # noqa: F401
from hvd.keras import elastic  # noqa: F401

# Names not in __all__ that Horovod users reach for.
for _n in dir(_impl):
    if not _n.startswith("_") and _n not in globals():
        globals()[_n] = getattr(_impl, _n)
del _n
