"""The Gradio side of the Space: the only part of the package that imports gradio.

``inputs`` (file inputs and what they accept), ``widgets`` (an option's widget), ``gpu`` (the one
GPU entry), ``page_runner`` (requests run and shown), ``endpoints`` (generated endpoint functions),
``error_board`` (errors and notices shown), ``layout`` (a task's tab, "All tasks", the about text). ``app.py`` at the top level assembles them.
"""
