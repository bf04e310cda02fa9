"""Declarations with one mistake: a key naming a field the payload does not have. Loading
them raises the DeclarationError the command line must print without a traceback."""

from pydantic import BaseModel

from sluicegate.declare import App, Debounce, Workflow


class Edit(BaseModel):
    documentId: str


app = App([Workflow(name="misspelt", payload=Edit,
                    debounce=Debounce(key="documentID", period="3s"))])
