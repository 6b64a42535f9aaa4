def test_x(tiny_server, openai_client):
    r = openai_client.completions.create(model="tiny", prompt="Hello", max_tokens=5, temperature=0)
    print(r)
    assert r.choices[0].text
