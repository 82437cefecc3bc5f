"""goosedump: GPT-OSS from GGUF files on a CPU, in bounded memory."""
from .model import Model, load
from .version import __version__
__all__ = ["Model", "load", "__version__"]
