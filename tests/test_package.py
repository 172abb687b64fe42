def test_train_is_the_function_however_often_it_is_used() -> None:
    # The name is shared with the scaletrain.train subpackage; the function must win, every time.
    import scaletrain.train.summary

    assert callable(scaletrain.train) and callable(scaletrain.train)
    assert scaletrain.train.__module__ == "scaletrain.api"
