"""Ray scheduling of the training path: one placement group, bundles handed to trainer ranks and engines."""
