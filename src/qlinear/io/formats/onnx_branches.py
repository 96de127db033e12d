"""If branches the calibration samples take, inlined into the main graph so that their layers' inputs can be
collected (onnxruntime exposes only main-graph tensors as outputs).

A main-graph If is replaced, in a copy of the model, by the nodes of one branch: its constants and nodes moved
into the main graph, and an Identity from each of the branch's outputs to the If's. The copy computes what the
model computes on the samples that take that branch; the nodes keep their names, so a weight's layer is found
there by its node's name. An If nested in the branch is then a main-graph If of the copy, inlined in turn
(`weight_rounding.Branches`); a branch path names the Ifs from the main graph down, ((If, branch), ...).
"""

from __future__ import annotations

BRANCHES = ("then_branch", "else_branch")


def conditions(model) -> dict[str, str]:
    """Main-graph If node name -> its condition tensor (Ifs without a name are left out)."""
    return {node.name: node.input[0] for node in model.graph.node if node.op_type == "If" and node.name}


def inline(model, taken: dict[str, str]):
    """A copy of ``model`` with each main-graph If named in ``taken`` replaced by the nodes of its branch
    ``taken[name]``; None if a branch's tensors would take names the main graph already has."""
    from onnx import ModelProto, helper

    copy = ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    outer = ({i.name for i in graph.input} | {t.name for t in graph.initializer}
             | {o for node in graph.node for o in node.output})
    nodes = []
    for node in graph.node:
        if node.op_type != "If" or node.name not in taken:
            nodes.append(node)
            continue
        branch = next(a.g for a in node.attribute if a.name == taken[node.name])
        made = {t.name for t in branch.initializer} | {o for n in branch.node for o in n.output}
        if made & outer:
            return None
        outer |= made
        graph.initializer.extend(branch.initializer)
        nodes.extend(branch.node)
        for inner, name in zip(branch.output, node.output):
            if name:
                nodes.append(helper.make_node("Identity", [inner.name], [name], name=f"{node.name}/{inner.name}"))
    del graph.node[:]
    graph.node.extend(nodes)
    return copy


def node_in_branch(model, location: str, node_name: str):
    """(the branch path, the node named ``node_name`` in it: bare, or after its scope as a use names it) for a
    constant or a use at ``location`` ("If 'A' then_branch > If 'B' else_branch: ..."), inside If branches from
    the main graph down; the path is ((A, then_branch), (B, else_branch), ...). None where a step of the scope is
    not an If's branch (a Loop's body) or a name is not found."""
    head = location.split(": ", 1)[0]
    node_name = node_name.removeprefix(head + ": ")  # a use names its node after its scope
    path = []
    for step in head.split(" > "):
        if not step.startswith("If '") or step.count("'") != 2:
            return None
        name, branch = step[4:].split("' ", 1)
        if branch not in BRANCHES:
            return None
        path.append((name, branch))
    graph = model.graph
    for name, branch in path:
        node = next((n for n in graph.node if n.op_type == "If" and n.name == name), None)
        graph = next((a.g for a in node.attribute if a.name == branch), None) if node is not None else None
        if graph is None:
            return None
    found = next((n for n in graph.node if n.name == node_name), None)
    return (tuple(path), found) if found is not None else None

