"""goosedump: GPT-OSS from GGUF files on a CPU, in bounded memory."""
from .model import Model, load

__version__ = "0.1.0"
__all__ = ["Model", "load", "__version__"]
