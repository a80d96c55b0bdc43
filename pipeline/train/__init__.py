"""Trainers: turn the pipeline's train data into new policy weights and a weight version."""
