"""rlinf_algos: RL advantages, losses and estimators as pure array functions.

Works on numpy arrays, torch tensors (autograd preserved) and any array-API namespace. See the README.
"""

from importlib.metadata import version as _version

from ._masked import masked_mean, masked_sum, safe_normalize
from ._registry import Registry

__version__ = _version("rlinf-algos")

__all__ = [
    "Registry",
    "__version__",
    "masked_mean",
    "masked_sum",
    "safe_normalize",
]
