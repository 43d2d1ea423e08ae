"""ftc's control side: cluster spec, state, providers (aws, local) and the bootstrap."""
