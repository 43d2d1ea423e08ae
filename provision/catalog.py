"""The default catalog: the instance types of the default world (providers.default_world: of the
built-ins, aws's), which `ftc bench network` emulates. Each provider's own catalog, with its prices,
is its World's (provision/providers/records.py): shared code asks `world(provider)`.
"""

from .providers import default_world

INSTANCE_TYPES = default_world().instance_types
