"""Engine layer: SimPy discrete-event model of continuous batching.

It asks the physics (capsim.physics.step.StepModel) how long each step takes and does no
physics itself.
"""
