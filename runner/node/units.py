"""How ftc writes a duration, on the nodes (the training log's eta) and on the controller (tables)."""


def duration(seconds: float) -> str:
    """12m05s, or 3h07m from an hour up."""
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"
