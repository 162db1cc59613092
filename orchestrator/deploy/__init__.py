"""The deploy application: the Operations facade, the engine loop, steps as data, preflight, locks."""
