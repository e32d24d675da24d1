"""gradwatch for the trainers that write the loop for you: one callback each.

    from gradwatch.integrations.transformers import GradwatchCallback   # Hugging Face Trainer
    from gradwatch.integrations.lightning import GradwatchCallback      # lightning / pytorch_lightning

Each module imports its framework when it is imported itself, never before: `import gradwatch`
stays free of transformers and Lightning (`pip install gradwatch[transformers]` or
`gradwatch[lightning]` installs them).
"""
