"""raygrid as a Ray Serve application: ``build_app`` (also ``build_openai_app``) and its ``LLMConfig``."""

from raygrid.serve.app import build_app, build_openai_app
from raygrid.serve.config import LLMConfig, ModelLoadingConfig, ServeArgs, ServerOptions

__all__ = ["build_app", "build_openai_app", "LLMConfig", "ModelLoadingConfig", "ServeArgs", "ServerOptions"]
