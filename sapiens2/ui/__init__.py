"""The Gradio side of the Space: the only part of the package that imports gradio.

``inputs`` (file inputs and what they accept), ``widgets`` (an option's widget), ``gpu`` (the one
GPU entry), ``handlers`` (generated endpoint functions, errors and notices), ``layout`` (a task's
tab, "All tasks", the about text). ``app.py`` at the top level assembles them.
"""
