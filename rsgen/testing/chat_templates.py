"""Chat templates for the tiny test models, one per prompt style, all with Qwen3's `enable_thinking` switch.

They follow the templates the real checkpoints ship (Qwen3 / Qwen3-VL, SmolVLM/Idefics3, LLaVA-1.5, as kept
in `trl/chat_templates/`), with three deliberate choices so every zoo model behaves the same way:

- `enable_thinking=False` closes an empty reasoning block after the generation prompt (`<think>\\n\\n</think>\\n\\n`),
  exactly like Qwen3; thinking on (the default) leaves the model free to open `<think>` itself.
- Assistant turns are rendered verbatim (reasoning included) and wrapped in `{% generation %}` markers, so the
  template is prefix-preserving and TRL's `assistant_only_loss` can mask by it.
- Content may be a string or a list of parts (`{"type": "image"}` / `{"type": "text", "text": ...}`) in any role.
"""

# Shared pieces, in Jinja: the text of a message's content, and the closed reasoning block for thinking off.
_CONTENT_TEXT = (
    "{%- macro content_text(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- else -%}{%- for part in content -%}{%- if part.type == 'text' or 'text' in part -%}{{ part.text }}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
)
_THINK_OFF = "{%- if enable_thinking is defined and enable_thinking is false -%}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif -%}"


def _user_parts(image_placeholder: str) -> str:
    """Jinja for a user turn's content: images become `image_placeholder`, text parts are copied."""
    return (
        "{%- if message.content is string -%}{{ message.content }}"
        "{%- else -%}{%- for part in message.content -%}"
        "{%- if part.type == 'image' or 'image' in part or 'image_url' in part -%}{{ '" + image_placeholder + "' }}"
        "{%- elif part.type == 'text' or 'text' in part -%}{{ part.text }}"
        "{%- endif -%}{%- endfor -%}{%- endif -%}"
    )


def chatml_template(image_placeholder: str) -> str:
    """Qwen-style ChatML (`<|im_start|>role\\n...<|im_end|>\\n`); Qwen*-VL use `<|vision_start|><|image_pad|><|vision_end|>`."""
    return (
        _CONTENT_TEXT
        + "{%- for message in messages -%}"
        "{%- if message.role == 'assistant' -%}"
        "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ content_text(message.content) }}{{ '<|im_end|>' }}"
        "{% endgeneration %}{{ '\\n' }}"
        "{%- elif message.role == 'user' -%}"
        "{{ '<|im_start|>user\\n' }}" + _user_parts(image_placeholder) + "{{ '<|im_end|>\\n' }}"
        "{%- else -%}"
        "{{ '<|im_start|>' + message.role + '\\n' }}{{ content_text(message.content) }}{{ '<|im_end|>\\n' }}"
        "{%- endif -%}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}" + _THINK_OFF + "{%- endif -%}"
    )


def idefics3_template() -> str:
    """Idefics3 / SmolVLM style: `<|begin_of_text|>User:<image>question<end_of_utterance>\\nAssistant:`."""
    return (
        _CONTENT_TEXT
        + "{{ '<|begin_of_text|>' }}"
        "{%- for message in messages -%}"
        "{%- set starts_with_image = message.content is not string and message.content|length > 0 "
        "and message.content[0].type == 'image' -%}"
        "{{ message.role | capitalize }}{{ ':' if starts_with_image else ': ' }}"
        "{%- if message.role == 'assistant' -%}"
        "{% generation %}{{ content_text(message.content) }}{{ '<end_of_utterance>' }}{% endgeneration %}"
        "{%- elif message.role == 'user' -%}" + _user_parts("<image>") + "{{ '<end_of_utterance>' }}"
        "{%- else -%}{{ content_text(message.content) }}{{ '<end_of_utterance>' }}"
        "{%- endif -%}{{ '\\n' }}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ 'Assistant: ' }}" + _THINK_OFF + "{%- endif -%}"
    )


def llava_template() -> str:
    """LLaVA-1.5 style: `USER: <image>\\nquestion ASSISTANT: answer</s>`; a system turn is a plain first line."""
    return (
        _CONTENT_TEXT
        + "{%- for message in messages -%}"
        "{%- if message.role == 'system' -%}{{ content_text(message.content) + '\\n' }}"
        "{%- elif message.role == 'user' -%}{{ 'USER: ' }}" + _user_parts("<image>\\n") + "{{ ' ' }}"
        "{%- elif message.role == 'assistant' -%}"
        "{{ 'ASSISTANT: ' }}{% generation %}{{ content_text(message.content) }}{{ '</s>' }}{% endgeneration %}"
        "{%- endif -%}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ 'ASSISTANT: ' }}" + _THINK_OFF + "{%- endif -%}"
    )
